"""``info`` and ``show`` on a published corpus (``s3://``, ``hf://``), reading no more than they print.

`remote_info` reads ``manifest.json`` (checked against a pinned digest when given) and ``shards.parquet``
(checked against the manifest), as a download's plan does, and summarizes them like `marin_data.corpus.info`
— what ``aws s3 ls`` or the Hub's dataset page would tell, plus the digest to pin. `remote_show` also
fetches ``tokenizer.json`` (checked) and opens one shard through byte-range reads (`StoreFile`), so that
pyarrow reads its footer and the row groups shown, never the whole shard.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator

from marin_data.corpus.index import read_shard_index
from marin_data.corpus.info import CorpusInfo
from marin_data.corpus.manifest import Manifest, summarize_subsets
from marin_data.corpus.records import ShardRecord
from marin_data.corpus.show import ShownDocument, decode_rows, shards_to_show
from marin_data.errors import InvalidManifestError, InvalidTokenizerError, RetryableRemoteError
from marin_data.layout import MANIFEST, TOKENIZER
from marin_data.raw.tokenizer import LoadedTokenizer, tokenizer_from_bytes
from marin_data.retry import retry_call
from marin_data.stores import open_store
from marin_data.stores.base import Store
from marin_data.transfer.plan import DOWNLOAD_POLICY, plan_download
from marin_data.transfer.versions import versioned

__all__ = ["StoreFile", "read_tokenizer", "read_tokenizer_bytes", "remote_info", "remote_show"]


class StoreFile(io.RawIOBase):
    """A read-only, seekable file over one object of a store: each read is one ranged request."""

    def __init__(self, store: Store, path: str, size: int) -> None:
        self.store, self.path, self.size, self.pos = store, path, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` from the current position, with one ranged request (retried): only the bytes asked
        for are kept, whatever the server sends (a 200 with the whole object is skipped through, not held)."""
        end = min(self.size, self.pos + len(buffer))
        if end <= self.pos:
            return 0
        out = memoryview(buffer).cast("B")

        def get() -> int:
            filled = 0
            with self.store.read(self.path, self.pos, end) as stream:
                at = stream.start
                for chunk in stream:
                    want = self.pos + filled  # the next byte we need
                    if at + len(chunk) > want:
                        piece = memoryview(chunk)[want - at:end - at]
                        out[filled:filled + len(piece)] = piece
                        filled += len(piece)
                    at += len(chunk)
            if self.pos + filled < end:
                raise RetryableRemoteError(f"truncated range: {filled} of {end - self.pos} bytes from byte "
                                           f"{self.pos}", path=self.store.describe(self.path))
            return filled

        n = retry_call(get, policy=DOWNLOAD_POLICY, what=self.store.describe(self.path))
        self.pos += n
        return n


def _open(url: str, manifest_sha256: str | None, store_options: dict):
    store = open_store(url, **store_options)
    plan, manifest_bytes, index_bytes = plan_download([store], subsets=None, manifest_sha256=manifest_sha256)
    store = versioned(store, manifest_bytes)  # the tokenizer of this version, never a newer one's
    manifest = Manifest.from_json(manifest_bytes, store.describe(MANIFEST))
    shards = read_shard_index(index_bytes, metadata=manifest.files)
    if summarize_subsets(shards, {k: v.license for k, v in manifest.subsets.items()}) != manifest.subsets:
        raise InvalidManifestError("subset totals disagree with the shard index", path=store.describe(MANIFEST))
    return store, plan, manifest, shards


def read_tokenizer_bytes(store: Store, manifest: Manifest) -> bytes:
    """The ``tokenizer.json`` bytes of the corpus in ``store``, read with retries, their sha256 the manifest's.

    Raises:
        InvalidTokenizerError: its sha256 is not the manifest's.
        RemoteError: the store cannot serve it.
    """
    rec = manifest.files.get(TOKENIZER)
    data = retry_call(lambda: store.read_bytes(TOKENIZER, limit=max(rec.bytes if rec else 0, 1)),
                      policy=DOWNLOAD_POLICY, what=store.describe(TOKENIZER))
    actual = hashlib.sha256(data).hexdigest()
    if actual != manifest.tokenizer.sha256:
        raise InvalidTokenizerError(f"tokenizer sha256 {actual} is not the manifest's {manifest.tokenizer.sha256}",
                                    path=store.describe(TOKENIZER), expected=manifest.tokenizer.sha256, actual=actual)
    return data


def read_tokenizer(store: Store, manifest: Manifest) -> LoadedTokenizer:
    """The tokenizer of the corpus in ``store`` (`read_tokenizer_bytes`, parsed)."""
    return tokenizer_from_bytes(read_tokenizer_bytes(store, manifest), manifest.tokenizer,
                                where=store.describe(TOKENIZER))


def remote_info(url: str, *, manifest_sha256: str | None = None, **store_options) -> CorpusInfo:
    """Summarize the corpus published at ``url`` from its manifest and shard index.

    Raises:
        ManifestHashMismatchError: the manifest is not the pinned one.
        InvalidManifestError: a malformed or inconsistent manifest or index.
        RemoteError: the store cannot be reached or refuses us.
    """
    _, plan, m, _ = _open(url, manifest_sha256, store_options)
    return CorpusInfo(root=url, name=m.name, version=m.version, manifest_sha256=plan.manifest_sha256,
                      tokenizer=m.tokenizer, subsets=dict(sorted(m.subsets.items())), mirrors=[])


def remote_show(url: str, *, subset: str, n: int = 5, doc_id: str | None = None,
                manifest_sha256: str | None = None, **store_options) -> list[ShownDocument]:
    """Decode documents of the corpus published at ``url`` (`marin_data.corpus.show`), reading one shard's
    footer and row groups in byte ranges.

    Raises:
        as `remote_info`, and InvalidTokenizerError for a ``tokenizer.json`` that is not the manifest's.
    """
    store, _, manifest, shards = _open(url, manifest_sha256, store_options)
    chosen = shards_to_show(shards, manifest.subsets, subset)
    tokenizer = read_tokenizer(store, manifest)

    def files() -> Iterator[tuple[ShardRecord, object]]:
        for s in chosen:
            yield s, StoreFile(store, s.path, s.bytes)

    return decode_rows(files(), tokenizer, n=n, doc_id=doc_id)
