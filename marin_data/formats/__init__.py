"""Every data format marin reads, behind one registry (`marin_data.formats.registry`).

- ``open_source(url, **store_options) -> Source``: what a path or URL holds, opened by its format;
  `Source` (`marin_data.formats.base`) is what the commands speak to.
- ``open_for_download(url, **store_options)``: `open_source`, or a corpus still to be read from a mirror.
- ``open_run(config, **kw)``: a training run's order, opened by the format that reads its config.
- ``decoder_for(corpus, read) -> ShardDecoder``: how the loader orders and decodes a corpus's shards.
- ``register(fmt)``: add a `Format`. The built-in ones, in detection order: ``marin`` (Parquet shards,
  `marin_data.formats.marin`), then the Levanter plug-in's ``levanter-cache`` and ``levanter-store``
  (`marin_data.levanter.formats`).
"""

from marin_data.formats.base import Downloaded, Format, Reader, ShardDecoder, Source
from marin_data.formats.registry import decoder_for, formats, get, open_for_download, open_run, open_source, \
    open_store_source, read_manifest, refuse_unpinned, register, unregister

__all__ = ["Downloaded", "Format", "Reader", "ShardDecoder", "Source", "decoder_for", "formats", "get",
           "open_for_download", "open_run", "open_source", "open_store_source", "read_manifest", "refuse_unpinned",
           "register", "unregister"]
