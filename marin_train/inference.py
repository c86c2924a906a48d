"""A saved model at work: what ``marin-train eval`` runs.

The model is whatever `marin_train.export.load_model` reads (a checkpoint, a run directory, an exported
model), whole on every process; under ``torchrun`` the ranks split the evaluation and agree on every number
(`marin_train.evaluate`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from marin_data.errors import LoaderConfigError, ModelTokenizerMismatchError
from marin_data.loader.stream import LoaderConfig
from marin_data.raw.tokenizer import token_byte_lengths
from marin_train.config import DataConfig
from marin_train.data import corpus_tokenizer, eval_config, eval_stream
from marin_train.distributed import init_distributed
from marin_train.evaluate import EvalResult, evaluate
from marin_train.export import SavedModel, load_model

__all__ = ["evaluate_saved", "run_seq_len"]


def run_seq_len(saved: SavedModel) -> int:
    """The sequence length the model was trained at (the held-out windows depend on it), else its maximum."""
    return int(saved.train.get("seq_len") or saved.model.cfg.max_seq_len)


def evaluate_saved(path: str, source: str, *, subsets: Sequence[str] | None = None, max_tokens: int | None = None,
                   batch_size: int = 8, seq_len: int | None = None, data: DataConfig = DataConfig()) -> EvalResult:
    """Evaluate the model at ``path`` on the held-out split of the corpus ``source`` (local or remote).

    Args:
        path: a checkpoint, a run directory or an exported model.
        source: the corpus: a directory, ``s3://bucket/prefix`` or ``hf://datasets/org/name``.
        subsets: names or globs to evaluate (default: every subset; a partial download's own).
        max_tokens: evaluate at most this many target tokens: the split's first ``max_tokens // seq_len``
            sequences (default: all of them).
        batch_size: sequences per forward.
        seq_len: default: the run's (`run_seq_len`); the held-out fraction is always the run's.
        data: store options, mirrors, a pinned manifest, the remote cache.

    Raises:
        InvalidCheckpointError: ``path`` holds no readable model.
        ModelTokenizerMismatchError: the corpus was tokenized otherwise than the model's training corpus.
        LoaderConfigError: ``max_tokens`` below one sequence, or nothing held out.
    """
    _, _, device = init_distributed()
    saved = load_model(path)
    seq_len = seq_len or run_seq_len(saved)
    val_fraction = saved.train.get("data", {}).get("val_fraction", LoaderConfig.val_fraction)
    max_sequences = None if max_tokens is None else max_tokens // seq_len
    if max_sequences == 0:
        raise LoaderConfigError(f"--max-tokens {max_tokens} is less than one sequence of {seq_len} tokens")
    stream = eval_stream(source, eval_config(seq_len, val_fraction, subsets), data=data)
    try:
        recorded = stream.corpus.manifest.tokenizer
        _check_tokenizer(saved, recorded.sha256, recorded.vocab_size, source)
        tokenizer = corpus_tokenizer(source, stream.corpus, data)
        result = evaluate(saved.model.to(device), stream, token_byte_lengths(tokenizer), batch_size=batch_size,
                          max_sequences=max_sequences, device=device)
    finally:
        if hasattr(stream, "close"):  # a remote stream: its cache's threads and directory lock
            stream.close()
    meta = {"model": str(saved.path), "step": saved.step, "data": source, "tokenizer": tokenizer.info.name,
            "val_fraction": val_fraction, "batch_size": batch_size, "max_tokens": max_tokens}
    return EvalResult(result.subsets, result.overall, result.seq_len, result.seconds, meta)


def _check_tokenizer(saved: SavedModel, sha256: str, vocab_size: int, source: str) -> None:
    """Refuse data whose token ids the model does not read as its training corpus's did."""
    if saved.tokenizer is not None:
        recorded = hashlib.sha256(saved.tokenizer.read_bytes()).hexdigest()
        if recorded != sha256:
            raise ModelTokenizerMismatchError(f"was tokenized with tokenizer {sha256[:12]}..., the model with "
                                              f"{recorded[:12]}... ({saved.tokenizer})", path=source,
                                              expected=recorded, actual=sha256)
    if vocab_size > saved.model.cfg.vocab_size:
        raise ModelTokenizerMismatchError(f"has a vocabulary of {vocab_size} tokens, the model "
                                          f"{saved.model.cfg.vocab_size}", path=source,
                                          expected=saved.model.cfg.vocab_size, actual=vocab_size)

