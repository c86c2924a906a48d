"""The one door to every data format: `open_source` says what a path or URL holds and opens it, and
`decoder_for` gives the loader a corpus's shard decoder. Nothing outside this package and the formats'
own packages knows which formats exist.

Detection is decided from files, never guessed. A ``manifest.json`` at the root (or one a killed local
commit left moving in) makes the source a corpus, opened by the format its ``format`` field names; else
each registered format's `Format.detect` is asked in registration order; else `UnknownSourceError` names
the file each format would have had. Adding a format is one `register` call (docs/design.md, "Adding a
format").
"""

from __future__ import annotations

import os

from marin_data.corpus.manifest import Corpus, Manifest
from marin_data.errors import InvalidManifestError, UnknownSourceError, UnpinnedCacheError, UnsupportedFormatError
from marin_data.formats.base import Format, Reader, ShardDecoder, Source
from marin_data.layout import CARD, COMMIT, LOCK_NAME, MANIFEST, STAGING
from marin_data.stores import open_store
from marin_data.stores.base import METADATA_LIMIT, Store
from marin_data.stores.local import LocalStore
from marin_data.transfer.read import read_file

__all__ = ["register", "unregister", "formats", "get", "open_source", "open_store_source", "open_for_download",
           "read_manifest", "decoder_for", "refuse_unpinned", "open_run"]

_FORMATS: list[Format] = []
_SHOWN = 5  # files named in the error of a path that holds nothing known


def _registered() -> list[Format]:
    """The registry, the built-in formats first (imported on first use: a plug-in imports this package's
    `base`, so the registry must not import the plug-ins before they are asked for)."""
    if not _FORMATS:
        from marin_data.formats.marin import MarinFormat
        from marin_data.levanter.formats import LevanterCacheFormat, LevanterStoreFormat

        _FORMATS.extend([MarinFormat(), LevanterCacheFormat(), LevanterStoreFormat()])
    return _FORMATS


def register(fmt: Format) -> None:
    """Add ``fmt`` to the registry, after the ones there (detection asks them in this order); one of the same
    name is replaced in place."""
    known = _registered()
    for i, other in enumerate(known):
        if other.name == fmt.name:
            known[i] = fmt
            return
    known.append(fmt)


def unregister(name: str) -> None:
    """Remove the format named ``name`` (a test's own format, when the test ends)."""
    _registered()[:] = [f for f in _FORMATS if f.name != name]


def formats() -> tuple[Format, ...]:
    return tuple(_registered())


def get(name: str, where: str = MANIFEST) -> Format:
    """The format named ``name``. Raises InvalidManifestError: no format has that name."""
    for fmt in _registered():
        if fmt.name == name:
            return fmt
    raise InvalidManifestError(f"unknown format {name!r} (this marin reads {', '.join(f.name for f in _registered())})",
                               path=where, actual=name)


def open_source(url: str | os.PathLike, **store_options) -> Source:
    """Open ``url`` (a local path, ``s3://...``, ``hf://datasets/...``; options as `open_store`) through the
    format that holds it (`open_store_source`)."""
    source = open_store_source(open_store(url, **store_options), store_options)
    source.given = os.fspath(url)
    return source


def open_for_download(url: str | os.PathLike, **store_options) -> Source:
    """`open_source`, except that a source that cannot be read or told (no such bucket, a manifest that does
    not parse, nothing known) is opened as a corpus whose manifest is yet to be read: a download then reads
    it from the first of its mirrors that serves one, and says what stopped the telling if none does
    (`marin_data.formats.corpus.UnreadCorpus`)."""
    from marin_data.formats.corpus import UnreadCorpus

    try:
        return open_source(url, **store_options)
    except (UnknownSourceError, OSError, ValueError) as e:  # OSError: RemoteError too
        return UnreadCorpus(os.fspath(url), store_options, e)


def open_store_source(store: Store, store_options: dict | None = None) -> Source:
    """What ``store`` holds, opened by its format.

    Raises:
        UnknownSourceError: no format recognises it.
        InvalidManifestError: a ``manifest.json`` that does not parse, or names no registered format.
        RemoteError: the store cannot be read.
    """
    found = _manifest(store)
    if found is not None:
        at, data, manifest = found
        source = get(manifest.format, store.describe(MANIFEST)).open_corpus(store, manifest)
        source.manifest_bytes = data if at == MANIFEST else None  # the root's bytes, as a download plans from
    else:
        source = next((s for f in _registered() if (s := f.detect(store)) is not None), None)
    if source is None:
        raise _unknown(store)
    source.options = dict(store_options or {})
    return source


def read_manifest(store: Store) -> Manifest | None:
    """The manifest at ``store``'s root, or the one a local commit killed midway left moving in (the
    corpus's until the next writer finishes it: ``adopt`` killed midway leaves it beside the caches)."""
    found = _manifest(store)
    return None if found is None else found[2]


def _manifest(store: Store) -> tuple[str, bytes, Manifest] | None:
    """`read_manifest`'s manifest with where it lies and its verbatim bytes."""
    at = MANIFEST if store.head(MANIFEST) is not None else None
    journal = f"{COMMIT}/{MANIFEST}"
    if at is None and isinstance(store, LocalStore) and store.head(journal) is not None:
        at = journal
    if at is None:
        return None
    data = read_file(store, at, limit=METADATA_LIMIT) or b""
    return at, data, Manifest.from_json(data, store.describe(at))


def decoder_for(corpus: Corpus, read: Reader) -> ShardDecoder:
    """The loader's decoder of ``corpus``'s shards (its manifest's format), reading files through ``read``."""
    return get(corpus.manifest.format, str(corpus.root / MANIFEST)).decoder(corpus, read)


def refuse_unpinned(where: str | os.PathLike | Store, why: str) -> None:
    """Raise `UnpinnedCacheError` (saying ``why`` a pin is needed) if ``where`` (a store, or a path or URL),
    where no manifest was found, holds a source no manifest vouches for; do nothing when it holds a corpus,
    nothing known, or cannot be read (the caller's own error then says what is wrong)."""
    try:
        found = open_store_source(where if isinstance(where, Store) else open_store(where))
    except (UnknownSourceError, OSError, ValueError):  # OSError: RemoteError too
        return
    if not found.pinned:
        raise UnpinnedCacheError(f"an unpinned {found.describe()}: no SHA-256 vouches for its chunk files, and "
                                 f"{why}", path=found.url if isinstance(where, Store) else str(where),
                                 actual=found.kind)


def open_run(config: str | os.PathLike, **kw):
    """The order of the training run whose config is at ``config``, opened by the format that reads such
    runs (a Levanter ``train_lm`` YAML: `marin_data.levanter.order.trace.open_trace`; ``kw`` as it takes
    them). Only the Levanter plug-in reads runs today.

    Raises:
        UnsupportedFormatError: no registered format reads training runs.
    """
    opener = next((fmt.open_run for fmt in _registered() if hasattr(fmt, "open_run")), None)
    if opener is None:
        raise UnsupportedFormatError("no registered format reads a training run's config", path=os.fspath(config))
    return opener(config, **kw)


def _unknown(store: Store) -> UnknownSourceError:
    markers: dict[str, str] = {MANIFEST: "a marin corpus"}
    for fmt in _registered():
        markers.setdefault(fmt.marker, fmt.what)
    files = [o.path for o in store.list() if o.path.split("/")[0] not in (LOCK_NAME, STAGING) and o.path != CARD]
    shown = ", ".join(files[:_SHOWN]) or "no files at all"
    wanted = [f"{name} ({what})" for name, what in markers.items()]
    return UnknownSourceError(f"no {' and no '.join(wanted)} at its root or in any folder below it (found: {shown})",
                              path=store.url, expected=list(markers))
