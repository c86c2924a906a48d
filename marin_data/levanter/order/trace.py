"""What a Levanter ``train_lm`` run read: forward (step -> its slots, their windows and documents), backward
(document -> every step and slot that served any of its tokens) and the exposure summary of a run up to a
step. Each answer is a JSON-ready dict; `marin_data.cli.trace` prints them.

Backward never scans steps: the document's sequences are inverted through the shuffles once, and the mixture
once per epoch of its component (`RunOrder.global_indices`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marin_data.errors import TrainConfigError
from marin_data.levanter.order.config import DEFAULT_VERSION, VERSIONS, LevanterRun, load_run
from marin_data.levanter.order.run import RunOrder
from marin_data.levanter.order.sources import ComponentCache, open_components
from marin_data.stores.base import Store

__all__ = ["Trace", "open_trace", "parse_document_id", "run_tokenizer"]


def parse_document_id(doc: str, names: list[str], cells: dict[str, str]) -> tuple[str, int]:
    """``COMPONENT:ROW`` or ``CELL:ROW`` (the ids of an adopted or converted corpus) -> (component, row)."""
    head, sep, row = doc.rpartition(":")
    if not sep or not row.isdigit():
        raise TrainConfigError(f"document id {doc!r}: expected COMPONENT:ROW or CELL:ROW")
    if head in names:
        return head, int(row)
    by_cell = [name for name, cell in cells.items() if cell == head]
    if len(by_cell) != 1:
        raise TrainConfigError(f"document id {doc!r}: {head!r} is neither a component with a positive weight nor "
                               "the cell of exactly one")
    return by_cell[0], int(row)


@dataclass
class Trace:
    """A run's order with its components' caches."""

    run: LevanterRun
    caches: dict[str, ComponentCache]
    version: str

    def __post_init__(self) -> None:
        self.order = RunOrder(self.run, {name: c.tokens for name, c in self.caches.items()})

    @property
    def seq_len(self) -> int:
        return self.run.seq_len

    def text_tokenizer(self, tokenizer: str | None, store: str | Store | None):
        """What ``--with-text`` decodes with (`run_tokenizer`)."""
        return run_tokenizer(self, tokenizer, store)

    def end_step(self, until: int | None) -> int:
        """``until`` (steps before it), or the run's ``trainer.num_train_steps``."""
        if until is not None:
            return until
        if self.run.num_train_steps is None:
            raise TrainConfigError("the YAML sets no trainer.num_train_steps: pass --until STEP")
        return self.run.num_train_steps

    def slot(self, component: int, sequence: int, *, documents: bool = True, text=None) -> dict:
        name = self.order.names[component]
        start, stop = sequence * self.seq_len, (sequence + 1) * self.seq_len
        out: dict = {"component": name, "sequence": sequence, "tokens": [start, stop]}
        cache = self.caches[name]
        if documents:
            out["documents"] = [{"row": d.row, "first": d.first, "last": d.last}
                                for d in cache.documents(start, stop)]
        if cache.pin is not None:
            out["cell"], out["license"] = cache.pin.cell, cache.pin.license
            out["shards"] = cache.shards(start, stop)
        if text is not None:
            out["text"] = text.decode(cache.tokens_in(start, stop).tolist(), skip_special_tokens=False)
        return out

    def step(self, step: int, *, documents: bool = True, text=None) -> dict:
        """``{"step", "levanter", "batch": [slot, ...]}``, slots in batch order; with ``text`` (a tokenizer),
        each window's tokens decoded."""
        component, sequence = self.order.step(step)
        batch: list = [None] * len(component)
        # one component's windows at a time, in cache order: a shuffle window's sequences share offsets inner
        # chunks, which a small cache then reads once
        for n in np.lexsort((sequence, component)):
            batch[n] = self.slot(int(component[n]), int(sequence[n]), documents=documents, text=text)
        return {"step": step, "levanter": self.version, "batch": batch}

    def document(self, doc: str, *, until: int | None = None) -> dict:
        """Every (step, slot) before ``until`` that served a token of document ``doc``."""
        cells = {name: c.cell for name, c in self.caches.items() if c.cell}
        name, row = parse_document_id(doc, self.order.names, cells)
        start, stop = self.caches[name].row_tokens(row)
        whole = self.order.chains[self.order.names.index(name)].sequences
        sequences = np.arange(start // self.seq_len, min(-(-stop // self.seq_len), whole), dtype=np.int64)
        end = self.end_step(until)
        indices = self.order.global_indices(self.order.names.index(name), sequences,
                                            self.order.batches.offset(end)) if len(sequences) else []
        steps = [self.order.batches.step_of(int(i)) for i in indices]
        slots = [int(i) - self.order.batches.offset(s) for i, s in zip(indices, steps)]
        return {"document": doc, "component": name, "row": row, "tokens": [start, stop],
                "sequences": sequences.tolist(), "until": end, "levanter": self.version, "steps": steps,
                "slots": slots}

    def summary(self, until: int | None = None) -> dict:
        """Per component, up to step ``until``: tokens served, epochs, fraction of its sequences seen, the
        first step it appears at; and the components never served."""
        end = self.end_step(until)
        stop = self.order.batches.offset(end)
        mixture = self.order.mixture
        block = stop // mixture.block_size
        head = mixture.block(block)[:stop - block * mixture.block_size] >> 16  # the partly served block
        rows, never = [], []
        for c, chain in enumerate(self.order.chains):
            served = int(mixture.served_before(np.array([block]), np.array([c]))[0]) + int(np.sum(head == c))
            first = int(mixture.indices_of(c, np.array([0]))[0])
            row = {"component": chain.name, "cell": self.caches[chain.name].cell, "sequences": chain.length,
                   "tokens_served": served * self.seq_len, "epochs": served / chain.length,
                   "fraction_seen": min(served, chain.length) / chain.sequences,
                   "first_step": self.order.batches.step_of(first) if 0 <= first < stop else None}
            rows.append(row)
            if not served:
                never.append(chain.name)
        unweighted = [n for n in self.run.components if n not in self.order.names]
        return {"until": end, "levanter": self.version, "components": rows, "never_served": never,
                "zero_weight": unweighted}


def open_trace(config: str, *, store: str | Store | None = None, version: str = DEFAULT_VERSION,
               **options) -> Trace:
    """Read a ``train_lm`` YAML and open the train cache of each component it weights (options as
    `marin_data.stores.open_store`)."""
    if version not in VERSIONS:
        raise TrainConfigError(f"Levanter {version} is not one marin reproduces ({', '.join(VERSIONS)})")
    run = load_run(config)
    weighted = {name: c.cache for name, c in run.components.items() if any(w.get(name, 0) > 0 for _, w in run.stages)}
    return Trace(run, open_components(weighted, store=store, **options), version)


def run_tokenizer(trace: Trace, tokenizer: str | None, store: str | Store | None):
    """The tokenizer ``--with-text`` decodes with: ``tokenizer`` (a ``tokenizer.json`` or a Hub id), else a
    pinned local store's own ``tokenizer.json``, checked against its manifest."""
    from pathlib import Path

    from marin_data.corpus.manifest import load_corpus
    from marin_data.errors import InvalidTokenizerError
    from marin_data.layout import TOKENIZER
    from marin_data.raw.tokenizer import load_tokenizer, tokenizer_from_bytes

    if tokenizer is not None:
        return load_tokenizer(tokenizer).tokenizer
    if isinstance(store, str) and any(c.pin for c in trace.caches.values()):
        manifest = load_corpus(store).manifest
        path = Path(store) / TOKENIZER
        return tokenizer_from_bytes(path.read_bytes(), manifest.tokenizer, where=str(path)).tokenizer
    raise InvalidTokenizerError("--with-text needs a tokenizer: pass --tokenizer (the one the caches were built "
                                "with), or --store a pinned store (it carries its own)")
