"""What a forked child does with the remote shard caches it inherits (a DataLoader worker started by fork).

The child gets a copy of every cache object but none of its fetch threads, and the cache's lock may have been
held by one of them at the fork. So right after a fork each of this process's caches is told
(`RemoteShardCache._after_fork_in_child`): it takes a fresh lock, drops its threads, and refuses to serve or
to release the directory lock, which stays the parent's. A worker reads through a cache of its own
(`RemoteStream.worker_init`).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

__all__ = ["track"]

_CACHES: weakref.WeakSet = weakref.WeakSet()  # this process's caches


def track(cache: Any) -> None:
    """Call ``cache._after_fork_in_child()`` in every child forked from now on while ``cache`` lives."""
    _CACHES.add(cache)


def _forget_at_fork() -> None:
    for cache in list(_CACHES):
        cache._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_at_fork)
