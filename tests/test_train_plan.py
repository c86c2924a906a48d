"""``python -m marin_train.plan``: the parameter bytes per rank it computes are what FSDP2 gives each rank."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from marin_model.config import get_preset
from marin_train.plan import PUBLISHED_FLOPS, make_plan, param_shard_numel

ROOT = Path(__file__).resolve().parent.parent

# Rank 0 of a fake process group (no communication) shards a meta-device model as training does.
MEASURE = """
import sys, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from marin_model.config import get_preset
from marin_model.model import Transformer
from marin_train.parallel import make_mesh, parallelize
preset, world, ep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
with torch.device("meta"):
    model = Transformer(get_preset(preset))
parallelize(model, make_mesh(ep, "cpu"), bf16=True)
print(sum(p.to_local().numel() for p in model.parameters()))
"""


@pytest.mark.parametrize("preset, world, ep", [
    ("tiny", 4, 2),
    pytest.param("marin-535b-a23b", 704, 64, marks=pytest.mark.slow),  # experts split on dim 0 (11 ranks each)
])
def test_plan_parameter_shard_equals_fsdp_on_a_meta_model(preset, world, ep):
    run = subprocess.run([sys.executable, "-c", MEASURE, preset, str(world), str(ep)], capture_output=True,
                         text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout.split()[-1]) == param_shard_numel(get_preset(preset), world, ep)


def test_marin_plan_fits_and_matches_the_published_compute():
    plan = make_plan(get_preset("marin-535b-a23b"), gpus=792, gpu_memory_gb=186, ep=64, seq_len=4096,
                     global_batch=11264, tokens=18.75e12, days=90)
    assert plan.world == 704 and plan.micro_batch * plan.accumulation * plan.world == 11264
    fixed = sum(v for k, v in plan.memory.items() if not k.startswith("activations"))
    assert fixed + plan.memory[f"activations, recompute (micro-batch {plan.micro_batch})"] <= 186e9
    assert 0.95 < plan.total_flops / PUBLISHED_FLOPS["marin-535b-a23b"] < 1.1
