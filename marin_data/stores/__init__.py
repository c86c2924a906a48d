"""Where a corpus lives: one small interface (`marin_data.stores.base.Store`) over local disk, S3 and
Hugging Face repos; `open_store` picks the backend from a URL.

Backends: `local` (a directory), `s3` (boto3/botocore, imported only when an ``s3://`` URL is opened), `hf`
(the Hugging Face Hub or a mirror of it, with `hub_ids` for the Hub's content ids and naming rules).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from marin_data.errors import RemoteError
from marin_data.stores.base import Store

__all__ = ["open_store"]


def open_store(url: str | os.PathLike, **options) -> Store:
    """Open the store at ``url``: ``s3://bucket/prefix``, ``hf://datasets/org/name[@rev]`` or a local
    directory (a path or ``file://``).

    Args:
        url: where the corpus root is.
        **options: backend options; for S3 see `marin_data.stores.s3.S3Store` (``endpoint_url``,
            ``profile``, ``anonymous``, ``requester_pays``, ``s3_compat``, ``max_connections``), for
            Hugging Face `marin_data.stores.hf.HfStore` (``endpoint``, ``token``). Each store takes its
            own and ignores the others'; a local path ignores them all.

    Raises:
        RemoteError: an unsupported scheme or a malformed URL.
    """
    text = os.fspath(url)
    scheme = urlsplit(text).scheme if "://" in text else ""
    hf_keys = ("endpoint", "token")  # HfStore's own options; the rest are S3's (one download may use both)
    if scheme == "hf":
        from marin_data.stores.hf import HfStore

        return HfStore(text, **{k: v for k, v in options.items() if k in (*hf_keys, "max_connections")})
    options = {k: v for k, v in options.items() if k not in hf_keys}
    if scheme == "s3":
        from marin_data.stores.s3 import S3Store  # botocore is imported only here

        return S3Store.from_url(text, **options)
    if scheme in ("", "file"):
        from marin_data.stores.local import LocalStore

        return LocalStore(urlsplit(text).path if scheme == "file" else text)
    raise RemoteError(f"unsupported URL scheme {scheme!r}: use s3://bucket/prefix, hf://datasets/org/name or a "
                      "local directory",
                      path=text)
