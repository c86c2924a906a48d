"""Train a byte-level BPE tokenizer: ``marin-data tokenizer train``, and the one the sample corpus trains.

`train_tokenizer` turns texts into ``tokenizer.json`` bytes: the GPT-2-style byte-level BPE of the
``tokenizers`` library, with every byte in its initial alphabet (any text encodes; nothing is unknown) and
`SPECIAL_TOKENS` first (EOS = 0, which ``shard`` appends after every document; BOS = 1, for ``shard --bos``).
`train_tokenizer_file` feeds it the documents of the inputs ``shard`` reads (`marin_data.raw.documents`:
JSON Lines, gzip, zstd, Parquet, globs, folders), one at a time: memory grows with the distinct words
seen, not with the input's size (one document is bounded by ``max_doc_bytes``). The same inputs, vocabulary
size and ``tokenizers`` version give the same bytes, whatever the thread count.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.errors import BadRecordError, DestinationExistsError
from marin_data.layout import TOKENIZER
from marin_data.raw.documents import DEFAULT_MAX_DOC_BYTES, expand_inputs, read_documents, source_names
from marin_data.ui import progress

__all__ = ["SPECIAL_TOKENS", "TrainedTokenizer", "train_tokenizer", "train_tokenizer_file"]

SPECIAL_TOKENS = ("<|end_of_text|>", "<|begin_of_text|>")  # EOS = 0, BOS = 1 (for `shard --bos`)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> bytes:
    """Train a byte-level BPE of ``vocab_size`` tokens on ``texts`` (any iterable, consumed once); return
    its ``tokenizer.json`` bytes (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer.to_str().encode()


@dataclass(frozen=True)
class TrainedTokenizer:
    """What `train_tokenizer_file` wrote, and from what."""

    path: str
    sha256: str
    vocab_size: int  # as trained: at most the one asked for (a small input has fewer merges to learn)
    inputs: int  # files
    documents: int
    skipped: dict[str, int]  # bad records skipped (skip_bad), by reason
    seconds: float


def train_tokenizer_file(
    inputs: Sequence[str | os.PathLike],
    *,
    vocab_size: int,
    out: str | os.PathLike,
    text_field: str = "text",
    skip_bad: bool = False,
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES,
    force: bool = False,
) -> TrainedTokenizer:
    """Train a byte-level BPE on the documents of ``inputs`` and write it to ``out``, atomically.

    Args:
        inputs: files, directories and globs, as ``marin-data shard`` takes them.
        vocab_size: the vocabulary to learn, special tokens and the 256 byte tokens included.
        out: the ``tokenizer.json`` to write; an existing directory gets ``out/tokenizer.json``.
        text_field: the field (Parquet: column) holding the text.
        skip_bad: skip malformed records and count them by reason instead of stopping.
        max_doc_bytes: the longest document in bytes; a longer one is a bad record.
        force: replace ``out`` if it exists (otherwise it is refused before any work).

    Raises:
        DestinationExistsError: ``out`` exists and ``force`` is False.
        BadRecordError, UnreadableInputError: bad input (see `marin_data.raw.documents`).
        UnsafeDestinationError: a symbolic link or a folder at ``out``.
    """
    target = Path(out) / TOKENIZER if Path(out).is_dir() else Path(out)
    if not force and (target.exists() or target.is_symlink()):
        raise DestinationExistsError("exists already; pass --force to replace it", path=str(target))
    paths = expand_inputs(inputs)
    skipped: Counter[str] = Counter()
    count = [0]

    def skip(e: BadRecordError) -> None:
        skipped[e.reason] += 1

    def texts(bar) -> Iterator[str]:
        for path, name in zip(paths, source_names(paths)):
            for doc in read_documents(path, source=name, text_field=text_field, max_doc_bytes=max_doc_bytes,
                                      on_bad=skip if skip_bad else None):
                count[0] += 1
                yield doc.text
            bar.update(path.stat().st_size)

    t0 = time.perf_counter()
    with progress(sum(p.stat().st_size for p in paths), "training", "B", unit_scale=True) as bar:
        data = train_tokenizer(texts(bar), vocab_size)
    atomic_write_bytes(target, data)
    from tokenizers import Tokenizer

    return TrainedTokenizer(path=str(target), sha256=hashlib.sha256(data).hexdigest(),
                            vocab_size=Tokenizer.from_str(data.decode()).get_vocab_size(), inputs=len(paths),
                            documents=count[0], skipped=dict(sorted(skipped.items())),
                            seconds=time.perf_counter() - t0)
