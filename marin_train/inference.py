"""A saved model at work: what ``marin-train eval`` and ``marin-train generate`` run.

The model is whatever `marin_train.export.load_model` reads (a checkpoint, a run directory, an exported
model), whole on every process; under ``torchrun`` the ranks split the evaluation and agree on every number
(`marin_train.evaluate`). Sampling decodes with the training corpus's tokenizer: the one the run recorded
(``tokenizer.json`` in its run directory, or beside an exported model), unless ``--tokenizer`` or ``--data``
names another, which must then be the same (by sha256) when the run recorded one.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from marin_data.errors import (ContextLengthError, LoaderConfigError, ModelTokenizerMismatchError,
                               UnknownModelTokenizerError)
from marin_data.loader.config import LoaderConfig
from marin_data.raw.tokenizer import LoadedTokenizer, load_tokenizer, token_byte_lengths
from marin_model.generate import generate
from marin_train.config import DataConfig
from marin_train.data import corpus_tokenizer, eval_config, eval_stream, source_manifest
from marin_train.distributed import init_distributed
from marin_train.evaluate import EvalResult, HeldOut, evaluate
from marin_train.export import SavedModel, load_model

__all__ = ["Sample", "evaluate_saved", "generate_text", "model_tokenizer", "run_seq_len"]


def run_seq_len(saved: SavedModel) -> int:
    """The sequence length the model was trained at (the held-out windows depend on it), else its maximum."""
    return int(saved.train.get("seq_len") or saved.model.cfg.max_seq_len)


def evaluate_saved(path: str, source: str, *, subsets: Sequence[str] | None = None, max_tokens: int | None = None,
                   batch_size: int = 8, seq_len: int | None = None, data: DataConfig = DataConfig(),
                   log: Callable[[str], None] = lambda line: None) -> EvalResult:
    """Evaluate the model at ``path`` on the held-out split of the corpus ``source`` (local or remote).

    Args:
        path: a checkpoint, a run directory or an exported model.
        source: the corpus: a directory, ``s3://bucket/prefix`` or ``hf://datasets/org/name``.
        subsets: names or globs to evaluate (default: every subset; a partial download's own).
        max_tokens: evaluate at most this many target tokens: the split's first ``max_tokens // seq_len``
            sequences (default: all of them).
        batch_size: sequences per forward.
        seq_len: default: the run's (`run_seq_len`); the held-out fraction and the packing are always the
            run's (a run that recorded none: the defaults), so that its held-out split is the one it never saw.
        data: store options, mirrors, a pinned manifest, the remote cache.
        log: gets which evaluation it is and its size before it runs (`HeldOut.describe`; rank 0 only); the
            result's ``meta["evaluation"]`` records it too.

    Raises:
        InvalidCheckpointError: ``path`` holds no readable model.
        ModelTokenizerMismatchError: the corpus was tokenized otherwise than the model's training corpus.
        LoaderConfigError: ``max_tokens`` below one sequence, or nothing held out.
    """
    rank, _, device = init_distributed()
    saved = load_model(path)
    seq_len = seq_len or run_seq_len(saved)
    run = saved.train.get("data", {})
    val_fraction = run.get("val_fraction", LoaderConfig.val_fraction)
    packing = run.get("packing", LoaderConfig.packing)
    max_sequences = None if max_tokens is None else max_tokens // seq_len
    if max_sequences == 0:
        raise LoaderConfigError(f"--max-tokens {max_tokens} is less than one sequence of {seq_len} tokens")
    stream = eval_stream(source, eval_config(seq_len, val_fraction, subsets, packing), data=data)
    try:
        recorded = stream.corpus.manifest.tokenizer
        _check_tokenizer(saved, recorded.sha256, recorded.vocab_size, source)
        tokenizer = corpus_tokenizer(source, stream.corpus.manifest, data)
        held = HeldOut.of(stream, max_sequences)
        if rank == 0:
            log(held.describe())
        result = evaluate(saved.model.to(device), stream, token_byte_lengths(tokenizer), batch_size=batch_size,
                          max_sequences=max_sequences, device=device)
    finally:
        stream.close()  # a remote stream's cache threads and directory lock
    meta = {"model": str(saved.path), "step": saved.step, "data": source, "tokenizer": tokenizer.info.name,
            "val_fraction": val_fraction, "batch_size": batch_size, "max_tokens": max_tokens,
            "threads": torch.get_num_threads(),  # the bits of the loss follow it (marin_train.threads)
            "evaluation": held.to_json()}
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



def model_tokenizer(saved: SavedModel, *, tokenizer: str | None = None, source: str | None = None,
                    data: DataConfig = DataConfig()) -> LoadedTokenizer:
    """The tokenizer to encode prompts for ``saved``: ``tokenizer`` (a tokenizer.json or Hugging Face repo id),
    else the corpus at ``source``'s, else the one its run recorded.

    Raises:
        UnknownModelTokenizerError: none given and none recorded.
        ModelTokenizerMismatchError: one given that is not the recorded one.
    """
    if tokenizer is not None:
        loaded = load_tokenizer(tokenizer)
        _check_tokenizer(saved, loaded.info.sha256, loaded.info.vocab_size, tokenizer)
        return loaded
    if source is not None:
        manifest = source_manifest(source, data)  # checked before its tokenizer is read
        _check_tokenizer(saved, manifest.tokenizer.sha256, manifest.tokenizer.vocab_size, source)
        return corpus_tokenizer(source, manifest, data)
    if saved.tokenizer is not None:
        return load_tokenizer(str(saved.tokenizer))
    raise UnknownModelTokenizerError("records no tokenizer (a run saves its corpus's tokenizer.json in its "
                                     "checkpoint directory; this model has none beside it)", path=str(saved.path))


@dataclass(frozen=True)
class Sample:
    prompt: str
    completion: str  # the decoded new tokens (special tokens such as EOS left out)
    tokens: int  # new tokens
    seconds: float  # generating them, prompt included
    dropped: int = 0  # prompt tokens cut from its start: the prompt and the new tokens fit the model's context


def generate_text(path: str, prompts: Sequence[str], *, max_new_tokens: int = 64, temperature: float = 1.0,
                  top_k: int = 0, seed: int = 0, tokenizer: str | None = None, source: str | None = None,
                  data: DataConfig = DataConfig(), use_cache: bool = True) -> list[Sample]:
    """Continue each prompt with the model at ``path`` (`marin_model.generate.generate`; stops at EOS).

    Args:
        path: a checkpoint, a run directory or an exported model.
        prompts: texts, encoded without special tokens as corpus documents are (BOS first when ``source``'s
            manifest says its documents start with one). A prompt keeps at most its last ``max_seq_len -
            max_new_tokens`` tokens, so that it and its continuation fit the model's context, and memory is
            bounded by the context, not by the prompt (`Sample.dropped` counts the tokens cut).
        temperature: 0 for greedy decoding; top_k: sample among the k most likely (0: all).
        seed: seeds the sampler (one generator for all the prompts, in order).
        tokenizer, source, data: which tokenizer (`model_tokenizer`).

    Raises:
        ContextLengthError: ``max_new_tokens`` leaves no room in the model's context for a prompt.
        InvalidCheckpointError, UnknownModelTokenizerError, ModelTokenizerMismatchError, InvalidTokenizerError.
    """
    saved = load_model(path)
    context = saved.model.cfg.max_seq_len
    if max_new_tokens >= context:
        raise ContextLengthError(f"the model's context is {context:,} positions: --max-new-tokens {max_new_tokens:,} "
                                 "leaves no room for a prompt", path=str(path), expected=context - 1,
                                 actual=max_new_tokens)
    loaded = model_tokenizer(saved, tokenizer=tokenizer, source=source, data=data)
    info, generator = loaded.info, torch.Generator().manual_seed(seed)
    out = []
    for prompt in prompts:
        ids = ([info.bos_id] if info.add_bos and info.bos_id is not None else []) + \
            loaded.tokenizer.encode(prompt, add_special_tokens=False).ids
        if not ids:
            raise ValueError("an empty prompt has no token to continue")
        dropped = max(0, len(ids) - (context - max_new_tokens))  # the prompt's last tokens fit, with the new ones
        ids = ids[dropped:]
        t0 = time.perf_counter()
        tokens = generate(saved.model, torch.tensor([ids]), max_new_tokens, temperature=temperature, top_k=top_k,
                          generator=generator, use_cache=use_cache, stop_token=info.eos_id)[0, len(ids):].tolist()
        seconds = time.perf_counter() - t0
        if info.eos_id in tokens:
            tokens = tokens[:tokens.index(info.eos_id) + 1]
        out.append(Sample(prompt, loaded.tokenizer.decode(tokens, skip_special_tokens=True), len(tokens), seconds,
                          dropped))
    return out
