"""Training on a GPU: FSDP2 (world 1, NCCL) with bf16 compute, the MoE layers on the `cuda/` kernels.

Needs only torch and `marin_model` (it runs in `scripts/gpu_check.sh`, on a machine without our data
dependencies), so the batches are synthetic: a few fixed random batches served round and round, with the
loader's keys and state protocol. Skipped without a CUDA device.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed.tensor import DTensor

from cuda_env import cuda_kernels  # noqa: F401 - autouse fixture

from marin_train.config import TrainConfig
from marin_train.loop import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CFG = TrainConfig(steps=30, batch_size=4, seq_len=64, warmup=3, log_every=1000,
                  model_overrides={"vocab_size": 512, "n_layers": 2})


class Repeating:
    """``count`` fixed batches of random tokens, served in turn forever; documents of 16 tokens each."""

    def __init__(self, cfg: TrainConfig, count: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        vocab = cfg.model_overrides["vocab_size"]
        self.windows = torch.randint(1, vocab, (count, cfg.batch_size, cfg.seq_len + 1), generator=g)
        offsets = torch.arange(cfg.seq_len, dtype=torch.int32)
        self.segment_ids = (offsets // 16).expand(cfg.batch_size, -1).contiguous()
        self.positions = (offsets % 16).expand(cfg.batch_size, -1).contiguous()
        self.position = 0

    def __iter__(self):
        while True:
            w = self.windows[self.position % len(self.windows)]
            self.position += 1
            yield {"input_ids": w[:, :-1], "labels": w[:, 1:], "segment_ids": self.segment_ids,
                   "positions": self.positions}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def test_bf16_training_on_cuda_learns_and_starts_where_fp32_on_cpu_does():
    gpu = train(CFG, Repeating(CFG), log=lambda _: None, device=torch.device("cuda"))
    losses = [r["loss"] for r in gpu.records]
    assert len(losses) == CFG.steps and all(torch.isfinite(torch.tensor(losses)))
    # ln(512) = 6.24 at the start; 30 steps over 4 repeated batches take it below 5.3 (fp32 on a CPU: 4.7).
    assert losses[-1] < losses[0] - 1.0, f"the loss did not fall on 4 repeated batches: {losses}"
    assert next(gpu.model.parameters()).device.type == "cuda"
    cpu = train(replace(CFG, steps=1), Repeating(CFG), log=lambda _: None, device=torch.device("cpu"))
    # Same initialisation and batch: the first loss differs only by bf16 rounding.
    assert abs(losses[0] - cpu.records[0]["loss"]) < 0.02 * cpu.records[0]["loss"]


def test_a_checkpoint_written_on_cuda_resumes_at_its_step(tmp_path):
    cfg = replace(CFG, steps=6, checkpoint_dir=str(tmp_path / "run"))
    first = train(cfg, Repeating(CFG), log=lambda _: None, device=torch.device("cuda"), until=3)
    data = Repeating(CFG)
    second = train(cfg, data, log=lambda _: None, device=torch.device("cuda"))
    assert first.steps == 3 and [r["step"] for r in second.records] == [4, 5, 6]
    assert data.position == 6  # the data resumed where the checkpoint left it


def test_twenty_steps_of_the_tiny_preset_under_fsdp2_on_one_gpu():
    cfg = replace(CFG, steps=20, model_overrides={"vocab_size": 512})  # all 4 layers of the tiny preset
    result = train(cfg, Repeating(cfg), log=lambda _: None, device=torch.device("cuda"))
    losses = [r["loss"] for r in result.records]
    assert len(losses) == 20 and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.5
    assert torch.distributed.get_world_size() == 1
    for name, p in result.model.named_parameters():
        assert isinstance(p, DTensor) and p.device_mesh.device_type == "cuda", name
        assert p.dtype == torch.float32, name  # fp32 master weights; bf16 only while gathered for compute
