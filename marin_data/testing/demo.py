"""`python -m marin_data.testing.demo CORPUS`: the loader over a corpus with a mixture schedule, and a resume.

What `make quickstart` shows: a two-phase schedule (a pretraining mix, then a mid-training mix), the first
batches with each row's subset and text, a checkpoint of the loader, and a resume on a different "cluster"
(2 ranks x 2 sequences instead of 1 x 4) that continues the same stream of sequences exactly.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from marin_data.corpus.manifest import load_corpus
from marin_data.layout import TOKENIZER
from marin_data.loader.dataset import TokenDataset, TokenLoader
from marin_data.loader.mixture import Phase
from marin_data.loader.stream import LoaderConfig, TokenStream
from marin_data.ui import format_table

__all__ = ["demo"]


def _decoder(root: Path):
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(root / TOKENIZER))
        return lambda ids: tokenizer.decode([int(i) for i in ids])
    except Exception:  # noqa: BLE001 - a display nicety: show token ids when the tokenizer cannot be loaded
        return lambda ids: " ".join(str(int(i)) for i in ids)


def _schedule(subsets: list[str]) -> list[Phase]:
    """8 sequences of equal weights over every subset, then a "mid-training" mix of the first and last."""
    return [Phase({name: 1 / len(subsets) for name in subsets}, 8), Phase({subsets[0]: 0.5, subsets[-1]: 0.5})]


def demo(corpus: str | Path, *, seq_len: int = 256, steps: int = 3, cache_dir: str | Path | None = None) -> bool:
    """Print a mixture run and a resume; return whether the resumed stream matched (it must)."""
    corpus = load_corpus(corpus)
    decode = _decoder(corpus.root)
    names = sorted(corpus.manifest.subsets)
    config = LoaderConfig(seq_len=seq_len, batch_size=4, mixture=_schedule(names), seed=0, val_fraction=0.01,
                          mixture_block=4, segments=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else Path(tempfile.mkdtemp(prefix="marin-loader-demo-"))
    stream = TokenStream(corpus, config, cache_dir=cache_dir)
    print(format_table(["subset", "sequences per pass", "held out"] + [f"phase {k}" for k in range(2)], [
        [name, stream.sizes()[name], stream.sizes("validation")[name],
         *(f"{w:.2f}" for w in (ph.weights()[k] for ph in stream.mixture.phases))]
        for k, name in enumerate(stream.subsets)]))
    print(f"phase 1 starts at position {stream.mixture.phases[1].start}; fingerprint {stream.fingerprint[:16]}...")

    loader = TokenLoader(TokenDataset(stream, rank=0, world_size=1))
    print(f"\n1 rank x 4 sequences of {seq_len} tokens, {steps} steps:")
    rows = []
    for step, batch in zip(range(steps), loader):
        for r in range(len(batch["index"])):
            text = decode(batch["input_ids"][r, :24]).replace("\n", "\\n").replace("\t", "\\t")[:56]
            rows.append([int(batch["index"][r]), step, stream.subsets[int(batch["subset"][r])],
                         int(batch["segment_ids"][r].max()) + 1, text])
    print(format_table(["position", "step", "subset", "documents", "starts with"], rows))
    state = loader.state_dict()
    print(f"\nstate_dict: position={state['position']}, fingerprint={state['fingerprint'][:16]}...")

    print("\nresume on 2 ranks x 2 sequences from that state:")
    resumed = []
    for rank in range(2):
        other = TokenLoader(TokenDataset(TokenStream(corpus, config, cache_dir=cache_dir), rank=rank, world_size=2))
        other.load_state_dict(state)
        resumed.append([b for _, b in zip(range(steps), other)])
    index = np.concatenate([b["index"].numpy() for step in zip(*resumed) for b in step])
    inputs, labels = ([np.concatenate([b[k].numpy() for step in zip(*resumed) for b in step]) for k in
                       ("input_ids", "labels")])
    reference = stream.read(range(state["position"], state["position"] + len(index)))
    same = bool(np.array_equal(index, reference.index) and np.array_equal(inputs, reference.input_ids)
                and np.array_equal(labels, reference.labels))
    print(f"positions {index.tolist()}")
    print(f"identical to the uninterrupted stream: {same}")
    far = 1_000_000 * 4
    print(f"\npasses over each subset by position {far:,} (step 1,000,000; computed, nothing replayed):")
    print(format_table(["subset", "passes"], [[k, f"{v:.1f}"] for k, v in stream.passes(far).items()]))
    return same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cache-dir", type=Path, help="decoded shards (default: a new temporary directory)")
    args = ap.parse_args()
    if not demo(args.corpus, seq_len=args.seq_len, steps=args.steps, cache_dir=args.cache_dir):
        raise SystemExit("the resumed stream differs from the uninterrupted one")


if __name__ == "__main__":
    main()
