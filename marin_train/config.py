"""A training run's configuration: typed dataclasses with commented defaults, and the presets.

Add a preset (`TRAIN_PRESETS`) rather than a flag per knob.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marin_data.loader.packing import DEFAULT_PACKING
from marin_model.config import ModelConfig, get_preset, with_overrides
from marin_train.schedule import Schedule

__all__ = ["DataConfig", "TrainConfig", "TRAIN_PRESETS"]


@dataclass(frozen=True)
class DataConfig:
    """Where the batches come from (read by `marin_train.data`; plain values only)."""

    source: str | None = None  # a corpus: local directory, s3://bucket/prefix or hf://datasets/org/name
    mixture: Mapping[str, float] | None = None  # subset names/globs -> weights; None: by token count
    mixture_from: tuple[tuple[int, Mapping[str, float]], ...] = ()  # (step, weights): the mixture from that step
    schedule: Schedule | None = None  # a schedule file's phases (marin_train.schedule), instead of the two above
    mirrors: tuple[str, ...] = ()  # fallback stores of a remote source
    manifest_sha256: str | None = None  # pins the corpus's manifest
    cache_dir: str | None = None  # a remote corpus's shard cache root, a local one's decoded shards (default: under
    # ~/.cache/marin, marin_data.loader.cache.default_cache_dir)
    cache_bytes: int = 64 << 30  # remote shard cache limit per rank
    store_options: Mapping[str, Any] = field(default_factory=dict)  # endpoint_url (S3), endpoint (HF), ...
    val_fraction: float = 0.001  # windows held out from training: the validation split (marin_data.loader.holdout)
    # How tokens become sequences (marin_data.loader.packing): "overlap" (seq_len + 1 tokens within a shard, document
    # boundaries masked) or "levanter" (Levanter's windows of seq_len tokens, causal attention across documents).
    packing: str = DEFAULT_PACKING


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Add a preset (`TRAIN_PRESETS`) rather than a flag per knob."""

    preset: str = "tiny"  # model preset (marin_model.config.PRESETS)
    steps: int = 100  # optimizer steps
    batch_size: int = 8  # sequences per rank per micro-batch (a resume keeps the checkpoint's global batch)
    accumulation: int = 1  # micro-batches per optimizer step
    seq_len: int = 64  # tokens per sequence
    lr: float = 3e-3  # peak learning rate
    warmup: int = 10  # steps of linear warmup
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * this
    weight_decay: float = 0.1  # AdamW, on matrices only
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    seed: int = 0  # model init and the loader's shuffle
    precision: str = "auto"  # "auto" (bf16 compute on CUDA, fp32 on CPU) | "bf16" | "fp32"; master weights fp32
    ep: int = 1  # expert-parallel degree: divides the world size and the routed experts
    recompute: bool = False  # activation checkpointing per block
    compile: bool = False  # torch.compile each block
    checkpoint_dir: str | None = None  # None: no checkpoints
    checkpoint_every: int = 0  # steps between checkpoints; 0: only at the end
    keep_checkpoints: int = 2  # newest checkpoints kept (older ones are deleted, and the log says so); 0: all
    log_every: int = 10  # steps between log lines (the first and last are always logged)
    eval_every: int = 0  # steps between held-out evaluations, and one at the last step (0: none)
    eval_tokens: int | None = None  # target tokens per evaluation, the split's first ones (None: all of it)
    eval_batch: int = 8  # sequences per evaluation forward: fixed, so the numbers do not depend on the ranks
    tensorboard_dir: str | None = None  # TensorBoard event files of every step here (the tensorboard extra)
    wandb_project: str | None = None  # log every step to this Weights & Biases project (the wandb extra)
    model_overrides: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"vocab_size": 8192}
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self):
        if min(self.steps, self.batch_size, self.accumulation, self.seq_len) < 1:
            raise ValueError("steps, batch_size, accumulation and seq_len must be >= 1")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")
        if self.ep < 1:
            raise ValueError(f"ep must be >= 1, got {self.ep}")
        if self.eval_every < 0 or self.eval_batch < 1 or (self.eval_tokens is not None and self.eval_tokens < 1):
            raise ValueError("eval_every must be >= 0, eval_batch and eval_tokens >= 1")
        if self.keep_checkpoints < 0:
            raise ValueError(f"keep_checkpoints must be >= 0 (0 keeps every checkpoint), got {self.keep_checkpoints}")

    def global_batch(self, world: int) -> int:
        """Sequences per optimizer step over ``world`` ranks."""
        return self.batch_size * self.accumulation * world

    def model_config(self) -> ModelConfig:
        return with_overrides(get_preset(self.preset), **self.model_overrides)


TRAIN_PRESETS: dict[str, TrainConfig] = {
    # The tiny model on a CPU: ~0.1-0.5 s a step on 2 cores; the loss falls visibly within 50 steps.
    "tiny": TrainConfig(),
    # The hero run: 390,251 steps at a global batch of 11,264 x 4096 (set batch_size x accumulation x ranks to
    # match), ~18.0T tokens; its mixture schedule: examples/schedules/marin-535b-a23b.yaml (--schedule).
    "marin-535b-a23b": TrainConfig(preset="marin-535b-a23b", steps=390_251, batch_size=1, accumulation=11,
                                   seq_len=4096, lr=3e-4, warmup=2000, checkpoint_every=1000,
                                   eval_tokens=1 << 27),  # ~33K sequences: a fraction of the held-out split
}
