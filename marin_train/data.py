"""The data of a run: the loader a `TrainConfig` describes, the held-out stream, the corpus's manifest and
tokenizer (what `marin_train.run` trains on, and ``marin-train eval``, ``generate`` and ``trace`` read).

A local corpus goes through `make_loader`, a remote one (``s3://``, ``hf://``) through `make_remote_loader`,
with this process's rank and world size from ``torch.distributed``; either may be a pinned Levanter cache
or store (its cells are the subsets). The model's vocabulary is the corpus tokenizer's, and a run with a
checkpoint directory keeps a copy of that ``tokenizer.json`` there (what ``marin-train generate`` decodes
with). `eval_stream` is the held-out stream `marin_train.evaluate` reads: built beside the training stream
for ``--eval-every``, or on its own for ``marin-train eval``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from pathlib import Path

from marin_data.corpus.manifest import Manifest, load_corpus
from marin_data.corpus.record import read_download_record
from marin_data.errors import InvalidScheduleError, InvalidTokenizerError, LoaderConfigError
from marin_data.layout import MANIFEST, TOKENIZER
from marin_data.loader import LoaderConfig, Phase, make_loader
from marin_data.loader.remote.stream import apart_pin, is_remote, make_remote_loader
from marin_data.loader.packing import DEFAULT_PACKING, PACKINGS
from marin_data.loader.stream import TokenStream, load_local
from marin_data.raw.tokenizer import LoadedTokenizer, tokenizer_from_bytes
from marin_data.stores import open_store
from marin_data.transfer.plan import plan_download
from marin_data.transfer.remote_corpus import read_tokenizer_bytes
from marin_train.config import DataConfig, TrainConfig
from marin_train.distributed import init_distributed
from marin_train.evaluate import EVAL_SEED

__all__ = ["corpus_tokenizer", "eval_config", "eval_stream", "mixture_schedule", "source_manifest",
           "tokenizer_bytes", "training_loader"]


def mixture_schedule(data: DataConfig, global_batch: int):
    """``data.mixture``, or with ``data.mixture_from`` the loader's phases: the mixture up to the first change
    step, each change's weights up to the next (``global_batch`` sequences a step; the loader may round a
    phase end to its mixture block, see `marin_data.loader.Phase`); or ``data.schedule``'s phases, whose global
    batch must be the run's."""
    if data.schedule is not None:
        if global_batch != data.schedule.global_batch:
            raise InvalidScheduleError(f"its phases start at steps of {data.schedule.global_batch:,} sequences, this "
                                       f"run's global batch is {global_batch:,} (batch x accumulation x ranks): set "
                                       "--batch-size and --accumulation to match", path=data.schedule.source,
                                       expected=data.schedule.global_batch, actual=global_batch)
        return data.schedule.loader_phases()
    if not data.mixture_from:
        return data.mixture
    if data.mixture is None:
        raise LoaderConfigError("--mixture-from needs --mixture: the weights before the first change")
    phases, start, weights = [], 0, data.mixture
    for step, changed in sorted(data.mixture_from, key=lambda change: change[0]):
        if step <= start:
            raise LoaderConfigError(f"--mixture-from steps must be positive and distinct, got {step}")
        phases.append(Phase(dict(weights), (step - start) * global_batch))
        start, weights = step, changed
    return [*phases, Phase(dict(weights))]


def training_loader(cfg: TrainConfig, *, rank: int | None = None, world_size: int | None = None):
    """The `TokenLoader` that ``cfg.data`` describes, serving ``cfg.batch_size`` x ``cfg.seq_len`` batches."""
    data = cfg.data
    if not data.source:
        raise LoaderConfigError("no training data: set DataConfig.source (--data) to a corpus path or URL")
    _, world = (rank, world_size) if world_size is not None else init_distributed()[:2]
    block = {"mixture_block": data.schedule.mixture_block} if data.schedule is not None else {}
    config = LoaderConfig(seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed,
                          mixture=mixture_schedule(data, cfg.global_batch(world)), val_fraction=data.val_fraction,
                          packing=data.packing, segments=_segments(data.packing),
                          vocab_size=cfg.model_overrides.get("vocab_size"), **block)  # no id past its vocabulary
    if is_remote(data.source) or apart_pin(data.source):  # a pin kept apart streams its shards from its data
        loader = make_remote_loader(data.source, config, mirrors=data.mirrors, manifest_sha256=data.manifest_sha256,
                                    cache_dir=data.cache_dir, cache_bytes=data.cache_bytes, rank=rank,
                                    world_size=world_size, **dict(data.store_options))
    else:
        corpus = load_local(data.source, manifest_sha256=data.manifest_sha256)
        loader = make_loader(corpus, config, rank=rank, world_size=world_size, cache_dir=data.cache_dir)
    if data.schedule is not None:
        try:
            data.schedule.check_loader(loader.dataset.stream.mixture)
        except InvalidScheduleError:
            loader.dataset.stream.close()  # a remote stream's cache threads and directory lock
            raise
    return loader


def _segments(packing: str) -> bool:
    """Whether batches carry document boundaries, so that the model masks attention across documents: with
    every packing that records them. A ``"levanter"`` window cannot (`marin_data.loader.packing`): the model
    attends causally across its documents. An unknown packing is the loader's to refuse, naming the others."""
    return packing not in PACKINGS or PACKINGS[packing].segments


def eval_config(seq_len: int, val_fraction: float, subsets: Sequence[str] | None = None,
                packing: str = DEFAULT_PACKING) -> LoaderConfig:
    """What `marin_train.evaluate` reads: the held-out split at a run's ``seq_len``, fraction and packing, in
    the fixed order of `EVAL_SEED`, with document boundaries where the packing has them (as in training)."""
    return LoaderConfig(seq_len=seq_len, batch_size=1, seed=EVAL_SEED, val_fraction=val_fraction,
                        subsets=None if subsets is None else list(subsets), packing=packing,
                        segments=_segments(packing))


def eval_stream(source: str, config: LoaderConfig, *, data: DataConfig = DataConfig()) -> TokenStream:
    """The stream of ``config`` (`eval_config`) over a local or remote corpus. Without ``config.subsets``,
    a partial download is evaluated on the subsets it holds. Close a remote one (``stream.close()``)."""
    if is_remote(source) or apart_pin(source):
        return make_remote_loader(source, config, mirrors=data.mirrors, manifest_sha256=data.manifest_sha256,
                                  cache_dir=data.cache_dir, cache_bytes=data.cache_bytes,
                                  **dict(data.store_options)).dataset.stream
    corpus = load_local(source, manifest_sha256=data.manifest_sha256)
    record = read_download_record(corpus.root)
    if config.subsets is None and record is not None:
        config = dataclasses.replace(config, subsets=list(record.subsets))
    return TokenStream(corpus, config, cache_dir=data.cache_dir)


def tokenizer_bytes(source: str, manifest: Manifest, data: DataConfig) -> bytes:
    """A corpus's ``tokenizer.json``, from its directory or its store, its sha256 the manifest's."""
    if is_remote(source):
        return read_tokenizer_bytes(open_store(source, **dict(data.store_options)), manifest)
    path = Path(source) / TOKENIZER
    raw, want = path.read_bytes(), manifest.tokenizer.sha256
    if hashlib.sha256(raw).hexdigest() != want:
        raise InvalidTokenizerError(f"is not the tokenizer the manifest names (sha256 {want})", path=str(path),
                                    expected=want, actual=hashlib.sha256(raw).hexdigest())
    return raw


def source_manifest(source: str, data: DataConfig = DataConfig()) -> Manifest:
    """The manifest of the corpus at ``source`` (a remote one read and checked as a download does)."""
    if not is_remote(source):
        return load_corpus(source, manifest_sha256=data.manifest_sha256).manifest
    store = open_store(source, **dict(data.store_options))
    _, manifest_bytes, _ = plan_download([store], subsets=None, manifest_sha256=data.manifest_sha256)
    return Manifest.from_json(manifest_bytes, store.describe(MANIFEST))


def corpus_tokenizer(source: str, manifest: Manifest, data: DataConfig = DataConfig()) -> LoadedTokenizer:
    """The tokenizer a corpus was encoded with, from its directory or its store, checked against its manifest."""
    return tokenizer_from_bytes(tokenizer_bytes(source, manifest, data), manifest.tokenizer,
                                where=f"{source}/{TOKENIZER}")
