"""Sharing one host's fetches between remote shard caches (`RemoteShardCache` ``peers``; docs/data.md).

The caches of one host (its ranks, a rank's DataLoader workers) register their directories as symlinks in a
shared ``peers`` directory. A cache about to fetch a shard takes the shard's lock there (so one cache fetches
it while the others wait), then looks for a peer's complete (sealed) decode of it and hard-links its files
into its own directory instead of fetching: one copy on disk, one request. A peer evicting its copy leaves
the others' links readable; a link that fails (evicted meanwhile, another file system) falls back to the
next peer, then to a fetch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from marin_data.loader.cache import SEAL, sealed
from marin_data.loader.remote.budget import decoded_dir

__all__ = ["Peers"]


class Peers:
    """The ``peers`` directory as the cache at ``root`` sees it (module docstring); registers ``root`` there."""

    def __init__(self, directory: Path, root: Path) -> None:
        self.directory, self.root = directory, root
        (directory / "locks").mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # registered already; or no symlinks here: peers cannot link from us
            (directory / root.name).symlink_to(root.resolve(), target_is_directory=True)

    def lock(self, sha256: str):
        """Held while a shard is fetched or linked, so the caches of one host fetch it once."""
        from filelock import FileLock

        return FileLock(str(self.directory / "locks" / f"{sha256}.lock"))

    def link(self, sha256: str) -> bool:
        """Hard-link a peer's complete decode of the shard into this cache; False when no peer has one."""
        own = decoded_dir(self.root, sha256)
        for peer in sorted(p for p in self.directory.iterdir() if p.is_symlink() and p.name != self.root.name):
            src = decoded_dir(peer, sha256)
            if not sealed(src):
                continue
            own.mkdir(parents=True, exist_ok=True)
            try:
                for name in ("offsets.npy", "tokens.npy", SEAL):  # the seal last: it means a complete decode
                    os.link(src / name, own / name)
                return True
            except OSError:  # the peer evicted it meanwhile, or another file system: try the next, then fetch
                shutil.rmtree(own, ignore_errors=True)
        return False
