"""A toy third format, to show what adding a format costs: this folder and one `register` call.

A toy corpus is a marin manifest and shard index (``format: "toy"``) over shards of its own kind: a ``.toy``
file is ``b"TOY1"``, the document count ``n`` (uint32), ``n`` document lengths (uint32), then the tokens
(uint32), all little-endian. Its documents and ids are those a Parquet corpus built from the same token lists
would hold, so a test can compare the two through the loader.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import Corpus, Manifest, load_corpus
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import check_shard_file
from marin_data.errors import ShardFormatError
from marin_data.fileio.arrays import write_npy
from marin_data.formats import Reader
from marin_data.formats.corpus import CorpusSource
from marin_data.layout import DATA, TOKENIZER
from marin_data.raw.tokenizer import TokenizerInfo
from marin_data.stores.base import Store

NAME = "toy"
MAGIC = b"TOY1"


class ToyFormat:
    name = NAME
    marker = "manifest.json"
    what = "a toy corpus"

    def detect(self, store: Store) -> None:
        return None  # a toy corpus always has its manifest

    def open_corpus(self, store: Store, manifest: Manifest) -> CorpusSource:
        return CorpusSource(store, manifest)

    def decoder(self, corpus: Corpus, read: Reader) -> ToyDecoder:
        return ToyDecoder(corpus)


class ToyDecoder:
    pieces = False

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    def order(self, subsets: Sequence[str]) -> list[tuple[ShardRecord, ...]]:
        return [tuple(sorted((s for s in self.corpus.shards if s.subset == n), key=lambda s: s.path)) for n in subsets]

    def context(self, shard: ShardRecord) -> None:
        return None

    def decode_into(self, path: Path, shard: ShardRecord, tokens_path: Path, offsets_path: Path, *,
                    verify: bool) -> None:
        if verify:
            check_shard_file(path, shard)
        data = np.frombuffer(path.read_bytes(), dtype="<u4")
        if data[:1].tobytes() != MAGIC:
            raise ShardFormatError("not a toy shard", path=str(path))
        n = int(data[1])
        lengths, tokens = data[2:2 + n], data[2 + n:]
        if n != shard.docs or len(tokens) != shard.tokens or int(lengths.sum()) != len(tokens):
            raise ShardFormatError("counts differ from the index's", path=str(path))
        write_npy(tokens_path, np.uint32, len(tokens), [np.ascontiguousarray(tokens)])
        write_npy(offsets_path, np.int64, n + 1, [np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)])


def write_toy_corpus(root: Path, shards: dict[str, list[list[np.ndarray]]], tokenizer: TokenizerInfo,
                     tokenizer_json: bytes) -> Corpus:
    """A toy corpus at ``root``: ``shards[subset]`` lists each shard's documents (token arrays)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / TOKENIZER).write_bytes(tokenizer_json)
    rows = []
    for subset, docs_of in sorted(shards.items()):
        for n, docs in enumerate(docs_of):
            lengths = np.array([len(d) for d in docs], dtype="<u4")
            data = MAGIC + np.array([len(docs)], "<u4").tobytes() + lengths.tobytes() + \
                np.concatenate(docs).astype("<u4").tobytes()
            rel = f"{DATA}/{subset}/part-{n:05d}.toy"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
            rows.append(ShardRecord(path=rel, subset=subset, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                                    docs=len(docs), tokens=int(lengths.sum()), row_groups=0))
    manifest = Manifest(name="toy", version="0", tokenizer=tokenizer, format=NAME,
                        subsets={s: SubsetInfo(0, 0, 0, 0, license="CC0-1.0") for s in shards})
    commit_corpus(root, manifest, rows)
    return load_corpus(root)
