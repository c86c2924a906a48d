"""Make the golden fixtures of Levanter's training order in ``tests/fixtures/levanter_order/`` with REAL Levanter.

For each config below, real Levanter builds the train set of a ``train_lm`` run exactly as ``train_lm`` does
(``LmDataConfig`` parsed by draccus from the YAML's ``data`` section, ``data_key`` derived from
``trainer.seed`` / ``data_seed`` as ``levanter.main.train_lm`` derives it, ``LmDataConfig.train_set``) over
small caches written by Levanter's own ``SerialCacheWriter``, whose token ``t`` of component ``c`` is
``c * 10**6 + t``: the first token of a served sequence names its component and its index ``j``. The fixture
keeps, for a few steps, every slot's ``[component, j]`` (key order matters: components take keys in config
order, so the JSON keeps the config's order); the test suite checks marin's numpy port against it
slot by slot without Levanter. It also writes threefry / ``jax.random`` known-answer vectors.

Nothing here imports marin. Recreate a throwaway venv (CPU only), then run from the repository root:

    /root/.pyenv/versions/3.12.1/bin/python3 -m venv /tmp/lev227
    /tmp/lev227/bin/pip install marin-levanter==0.2.227.dev40316220070
    JAX_PLATFORMS=cpu /tmp/lev227/bin/python scripts/make_levanter_order_fixtures.py --levanter-version 0.2.227

    python3.11 -m venv /tmp/lev20
    /tmp/lev20/bin/pip install marin-levanter==0.2.20.dev202606180959
    JAX_PLATFORMS=cpu /tmp/lev20/bin/python scripts/make_levanter_order_fixtures.py --levanter-version 0.2.20

Each version writes its own ``<config>-<version>.json``; ``--check`` rebuilds and exits 1 when a fixture differs.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "tests" / "fixtures" / "levanter_order"
PINS = {"0.2.20": "0.2.20.dev202606180959", "0.2.227": "0.2.227.dev40316220070"}
TAG = 10**6  # component c's token t is c * TAG + t
SEQ = 4
# Any local tokenizer will do (the order does not depend on it): the one tests/fixtures/levanter ships.
TOKENIZER = ROOT / "tests" / "fixtures" / "levanter" / "levanter-fixture-wordlevel"
STEPS = [0, 1, 2, 5, 11, 40, 97]
# Token counts per component: not multiples of SEQ (the tail is dropped), documents of uneven lengths.
SIZES = {"alpha": 2_403, "beta": 1_201, "gamma": 613, "delta": 450}
NAMES = list(SIZES)


def base(**data) -> dict:
    cfg = {"data": {"tokenizer": "tokenizer",
                    "components": {n: {"type": "cached", "cache_dir": n, "flat_cache": True} for n in SIZES},
                    "train_weights": {"alpha": 0.5, "beta": 0.3, "gamma": 0.2, "delta": 0.0},
                    "mixture_block_size": 16},
           "trainer": {"seed": 0, "train_batch_size": 8}, "model": {"max_seq_len": SEQ}}
    cfg["data"].update(data)
    return cfg


def configs() -> dict[str, dict]:
    out = {
        "shuffle-none": base(shuffle=False),
        "full-feistel": base(shuffle=True, permutation_type="feistel"),
        "full-linear": base(shuffle=True, permutation_type="linear"),
        "block-shuffle": base(shuffle={"io_block_size": 8, "window_blocks": 3, "perm_type": "feistel"}),
        "block-linear": base(shuffle={"io_block_size": 5, "window_blocks": 2, "perm_type": "linear"}),
        "default-shuffle": base(),
        "staged-weights": base(shuffle=True, train_weights=[[0, {"alpha": 0.6, "beta": 0.4}],
                                                            [4, {"alpha": 0.1, "gamma": 0.5, "delta": 0.4}]]),
        "data-seed": base(shuffle=True),
        "validation-split": base(shuffle=True, num_validation_sequences={"alpha": 37, "gamma": 5}),
        "validation-positional": base(shuffle=False, num_validation_sequences={"beta": 11},
                                      shuffle_before_trainval_split=False),
        "budget": base(shuffle=True, target_budget=1000, experiment_budget=300),
        # 5.6 / 5.6 / 4.8 slots truncate to 5 / 5 / 4: the remainder goes to the first of the tied largest
        "tied-counts": base(shuffle=False, train_weights={"alpha": 0.35, "beta": 0.35, "gamma": 0.3}),
        "max-train-batches": base(shuffle={"io_block_size": 4, "window_blocks": 2}, max_train_batches={"gamma": 2}),
    }
    out["data-seed"]["data_seed"] = 1234
    out["data-seed"]["trainer"]["seed"] = 7
    out["staged-weights"]["trainer"]["train_batch_size"] = [{"start": 0, "value": 8}, {"start": 2, "value": 16}]
    out["full-feistel"]["trainer"]["seed"] = 3
    return out


def write_caches(root: Path) -> None:
    from levanter.store.cache import SerialCacheWriter

    rng = np.random.default_rng(0)
    for c, (name, size) in enumerate(SIZES.items()):
        tokens = (c * TAG + np.arange(size)).astype(np.int32)
        cuts = np.sort(rng.choice(np.arange(1, size), size=size // 9, replace=False))
        with SerialCacheWriter(str(root / name), {"input_ids": np.zeros(0, dtype=np.int32)}) as writer:
            writer.write_batch([{"input_ids": d} for d in np.split(tokens, cuts)])


def trace(cfg: dict, root: Path) -> dict:
    import draccus
    import haliax as hax
    import jax.random as jrandom
    from levanter.data.text.datasets import LmDataConfig
    from levanter.schedule import BatchSchedule, ScheduleStep

    data = copy.deepcopy(cfg["data"])
    data["tokenizer"] = str(TOKENIZER)
    for spec in data["components"].values():
        spec["cache_dir"] = str(root / spec["cache_dir"])
    path = root / "data.yaml"
    path.write_text(json.dumps(data))
    config = draccus.parse(LmDataConfig, config_path=str(path), args=[])
    trainer = cfg["trainer"]
    batch = trainer["train_batch_size"]
    schedule = BatchSchedule(batch if isinstance(batch, int) else [ScheduleStep(**s) for s in batch])
    # as levanter.main.train_lm derives it
    data_key, _, _, _ = jrandom.split(jrandom.PRNGKey(trainer["seed"]), 4)
    if cfg.get("data_seed") is not None:
        data_key = jrandom.PRNGKey(cfg["data_seed"])
    dataset = config.train_set(hax.Axis("position", cfg["model"]["max_seq_len"]), schedule, key=data_key)
    steps = {}
    for step in STEPS:
        indices = list(schedule.batch_indices_at_step(step))
        examples = asyncio.run(dataset.get_batch(indices))
        first = [int(np.asarray(ex.tokens.array if hasattr(ex.tokens, "array") else ex.tokens)[0])
                 for ex in examples]
        steps[str(step)] = [[NAMES[t // TAG], (t % TAG) // SEQ] for t in first]
    return steps


def kat() -> dict:
    """Known-answer vectors of jax.random under the installed JAX."""
    import jax
    import jax.random as jr

    out = {"jax": jax.__version__, "partitionable": bool(jax.config.jax_threefry_partitionable), "cases": []}
    for seed in (0, 1, 42, 1234, 2**31 - 1):
        k = jr.PRNGKey(seed)
        out["cases"].append({
            "seed": seed, "key": np.asarray(k).tolist(), "split3": np.asarray(jr.split(k, 3)).tolist(),
            "fold_in_7": np.asarray(jr.fold_in(k, 7)).tolist(),
            "fold_in_big": np.asarray(jr.fold_in(k, 4_000_000_000)).tolist(),
            "bits6": np.asarray(jr.bits(k, (6,))).tolist(),
            "randint_0_1000": np.asarray(jr.randint(k, (5,), 0, 1000)).tolist(),
            "randint_2pow30": int(jr.randint(k, (), 0, 2**30)),
            "randint_neg": np.asarray(jr.randint(k, (4,), -50, 77)).tolist(),
            "perm10": np.asarray(jr.permutation(k, 10)).tolist(),
            "perm2000_head": np.asarray(jr.permutation(k, 2000))[:16].tolist(),
            "perm2000_sum_sq": int((np.asarray(jr.permutation(k, 2000)).astype(np.int64) ** 2
                                    * np.arange(2000)).sum()),
            # 200,000 values draw tied sort keys (about 4.7 pairs a round): only a stable sort matches
            "perm200000_sum_sq": int((np.asarray(jr.permutation(k, 200_000)).astype(np.int64) ** 2
                                      * np.arange(200_000)).sum()),
        })
    return out


def build(ver: str) -> dict[str, dict]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_caches(root)
        for name, cfg in configs().items():
            out[f"{name}-{ver}.json"] = {"levanter": version("marin-levanter"), "config": cfg, "tokens": SIZES,
                                         "seq_len": SEQ, "steps": trace(cfg, root)}
    out[f"threefry-{ver}.json"] = kat()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levanter-version", choices=sorted(PINS), default="0.2.227")
    parser.add_argument("--check", action="store_true", help="rebuild and compare; write nothing")
    args = parser.parse_args()
    installed = version("marin-levanter")
    if installed != PINS[args.levanter_version]:
        sys.exit(f"marin-levanter {installed} is installed; --levanter-version {args.levanter_version} wants "
                 f"{PINS[args.levanter_version]}")
    built = build(args.levanter_version)
    differ = 0
    for name, content in built.items():
        text = json.dumps(content, separators=(",", ":")) + "\n"
        if args.check:
            old = (DEST / name).read_text() if (DEST / name).exists() else ""
            differ += old != text
            print(("same   " if old == text else "DIFFERS ") + name)
        else:
            DEST.mkdir(parents=True, exist_ok=True)
            (DEST / name).write_text(text)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
