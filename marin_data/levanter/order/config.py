"""The keys of a Levanter ``train_lm`` YAML that decide its order, read into a `LevanterRun`.

Supported (docs/what-did-the-model-see.md has the table): ``data.components`` (cached, with ``cache_dir`` and
``flat_cache``; ``data.cache_dir`` roots those without one), ``data.train_weights`` (a dict, or staged
``[step, weights]`` pairs), ``data.mixture_block_size``, ``data.shuffle`` (bool or ``{io_block_size,
window_blocks, perm_type}``), ``data.permutation_type``, ``data.stop_strategy``,
``data.num_validation_sequences`` + ``data.shuffle_before_trainval_split``, ``data.max_train_batches``,
``data.target_budget`` / ``data.experiment_budget``, ``trainer.seed``, ``trainer.train_batch_size`` (an int
or ``[{start, value}, ...]``), ``trainer.num_train_steps``, ``data_seed``, ``train_seq_len``, else
``model.max_seq_len`` / ``model.seq_len``. A ``data`` key outside that list, or a value that changes the order
in a way marin does not reproduce, is refused by name (`UnsupportedOrderKeyError`), never answered differently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marin_data.errors import TrainConfigError, UnsupportedOrderKeyError

__all__ = ["LevanterRun", "Component", "Shuffle", "parse_run", "load_run", "VERSIONS", "DEFAULT_VERSION"]

VERSIONS = ("0.2.20", "0.2.227")
DEFAULT_VERSION = "0.2.227"
MAX_YAML_BYTES = 64 * 2**20
# data keys that leave the order alone (tokenizing, caching, attention masks)
_NEUTRAL_DATA_KEYS = {"tokenizer", "vocab_size", "cache_options", "enforce_eos", "auto_build_caches",
                      "chat_template", "block_cross_document_attention", "cache_catalog", "id", "name"}
_ORDER_DATA_KEYS = {"components", "train_weights", "mixture_block_size", "shuffle", "permutation_type",
                    "stop_strategy", "num_validation_sequences", "shuffle_before_trainval_split", "max_train_batches",
                    "target_budget", "experiment_budget", "cache_dir"}
_COMPONENT_KEYS = {"type", "cache_dir", "flat_cache", "source", "tags", "split", "format", "pack"}
STOP_STRATEGIES = ("restart", "all_exhausted", "first_exhausted")


@dataclass(frozen=True)
class Component:
    name: str
    cache: str  # the cache root the train split is read from


@dataclass(frozen=True)
class Shuffle:
    kind: str  # "none", "full" or "block"
    perm_type: str = "feistel"
    io_block_size: int = 0
    window_blocks: int = 0


DEFAULT_SHUFFLE = Shuffle("block", "feistel", 256, 512)  # DEFAULT_LM_DATA_SHUFFLE, the same in both versions


@dataclass(frozen=True)
class LevanterRun:
    """What decides the order of one ``train_lm`` run."""

    components: dict[str, Component]
    stages: list[tuple[int, dict[str, float]]]  # [(step, weights)], steps in training steps
    block_size: int = 2048
    shuffle: Shuffle = DEFAULT_SHUFFLE
    stop_strategy: str = "restart"
    validation: dict[str, int] = field(default_factory=dict)
    shuffle_before_split: bool = True
    max_train_batches: dict[str, int] = field(default_factory=dict)
    budget_ratio: float | None = None  # experiment_budget / target_budget
    seed: int = 0
    data_seed: int | None = None
    batch: list[tuple[int, int]] = field(default_factory=lambda: [(0, 512)])  # [(start step, batch size)]
    seq_len: int = 0
    num_train_steps: int | None = None


def _refuse(key: str, why: str, path: str | None) -> UnsupportedOrderKeyError:
    return UnsupportedOrderKeyError(f"{key}: {why}; marin does not reproduce that order", key=key, path=path)


def _int(value: Any, key: str, path: str | None, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TrainConfigError(f"{key} must be an integer >= {minimum}, got {value!r}", path=path)
    return value


def _seed(value: Any, key: str, path: str | None) -> int:
    """A seed JAX takes as its default int32."""
    if isinstance(value, bool) or not isinstance(value, int) or not -2**31 <= value < 2**31:
        raise TrainConfigError(f"{key} must be an integer that fits int32 (JAX's seed type), got {value!r}", path=path)
    return value


def _mapping(value: Any, key: str, path: str | None) -> dict:
    if not isinstance(value, dict):
        raise TrainConfigError(f"{key} must be a mapping, got {type(value).__name__}", path=path)
    return value


def _weights(value: Any, key: str, names: dict, path: str | None) -> dict[str, float]:
    weights = _mapping(value, key, path)
    for name, w in weights.items():
        if name not in names:
            raise TrainConfigError(f"{key} names {name!r}, which is not a component", path=path)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
            raise TrainConfigError(f"{key}.{name} must be a non-negative number, got {w!r}", path=path)
    return weights


def _components(data: dict, path: str | None) -> dict[str, Component]:
    found = {}
    for name, spec in _mapping(data.get("components") or {}, "data.components", path).items():
        key = f"data.components.{name}"
        spec = _mapping(spec, key, path)
        if spec.get("type", "cached") != "cached":
            raise _refuse(f"{key}.type", f"a {spec['type']!r} component", path)
        for k in spec:
            if k not in _COMPONENT_KEYS:
                raise _refuse(f"{key}.{k}", "an unknown component key", path)
        if spec.get("pack"):
            raise _refuse(f"{key}.pack", "packed examples", path)
        fmt = spec.get("format")
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type", "text") != "text"):
            raise _refuse(f"{key}.format", "a format other than plain text", path)
        root = spec.get("cache_dir")
        if root is None:
            if data.get("cache_dir") is None:
                raise TrainConfigError(f"{key} has no cache_dir and data.cache_dir is not set", path=path)
            root = f"{str(data['cache_dir']).rstrip('/')}/{name}"
        if not isinstance(root, str):
            raise TrainConfigError(f"{key}.cache_dir must be a string", path=path)
        found[name] = Component(name, root.rstrip("/") if spec.get("flat_cache") else f"{root.rstrip('/')}/train")
    if not found:
        raise TrainConfigError("data.components names no component", path=path)
    return found


def _shuffle(data: dict, path: str | None) -> Shuffle:
    perm = data.get("permutation_type", "feistel")
    if perm not in ("feistel", "linear"):
        raise TrainConfigError(f"data.permutation_type must be feistel or linear, got {perm!r}", path=path)
    value = data.get("shuffle", None)
    if value is None:
        return DEFAULT_SHUFFLE
    if value is True:
        return Shuffle("full", perm)
    if value is False:
        return Shuffle("none")
    if isinstance(value, int):
        raise _refuse("data.shuffle", "an era shuffle (an integer era length)", path)
    spec = _mapping(value, "data.shuffle", path)
    extra = set(spec) - {"io_block_size", "window_blocks", "perm_type"}
    if extra:
        raise _refuse(f"data.shuffle.{sorted(extra)[0]}", "an unknown block-shuffle key", path)
    kind = spec.get("perm_type", "feistel")
    if kind not in ("feistel", "linear"):
        raise TrainConfigError(f"data.shuffle.perm_type must be feistel or linear, got {kind!r}", path=path)
    return Shuffle("block", kind, _int(spec.get("io_block_size"), "data.shuffle.io_block_size", path, 1),
                   _int(spec.get("window_blocks"), "data.shuffle.window_blocks", path, 1))


def _batch(trainer: dict, path: str | None) -> list[tuple[int, int]]:
    value = trainer.get("train_batch_size", 512)
    if isinstance(value, list):
        steps = []
        for n, seg in enumerate(value):
            seg = _mapping(seg, f"trainer.train_batch_size[{n}]", path)
            steps.append((_int(seg.get("start"), f"trainer.train_batch_size[{n}].start", path),
                          _int(seg.get("value"), f"trainer.train_batch_size[{n}].value", path, 1)))
        if not steps or steps[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(steps, steps[1:])):
            raise TrainConfigError("trainer.train_batch_size: a schedule starts at step 0 and increases", path=path)
        return steps
    return [(0, _int(value, "trainer.train_batch_size", path, 1))]


def _stages(data: dict, components: dict, path: str | None) -> list[tuple[int, dict[str, float]]]:
    value = data.get("train_weights")
    if value is None:
        return [(0, {name: 1.0 for name in components})]
    if isinstance(value, dict):
        return [(0, _weights(value, "data.train_weights", components, path))]
    if not isinstance(value, list) or not value:
        raise TrainConfigError("data.train_weights must be a mapping or a list of [step, weights]", path=path)
    stages = []
    for n, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TrainConfigError(f"data.train_weights[{n}] must be [step, weights]", path=path)
        stages.append((_int(pair[0], f"data.train_weights[{n}] step", path),
                       _weights(pair[1], f"data.train_weights[{n}]", components, path)))
    return stages


def parse_run(config: Any, path: str | None = None) -> LevanterRun:
    """A `LevanterRun` from a parsed ``train_lm`` YAML.

    Raises:
        UnsupportedOrderKeyError: a key that changes the order in a way marin does not reproduce.
        TrainConfigError: anything else malformed.
    """
    config = _mapping(config, "the YAML", path)
    data = _mapping(config.get("data"), "data", path)
    for key in data:
        if key not in _NEUTRAL_DATA_KEYS | _ORDER_DATA_KEYS:
            raise _refuse(f"data.{key}", "a data key that may change the order", path)
    strategy = data.get("stop_strategy", "restart")
    if strategy not in STOP_STRATEGIES:
        raise TrainConfigError(f"data.stop_strategy must be one of {', '.join(STOP_STRATEGIES)}", path=path)
    components = _components(data, path)
    trainer = _mapping(config.get("trainer") or {}, "trainer", path)
    model = _mapping(config.get("model") or {}, "model", path)
    seq_len = config.get("train_seq_len") or model.get("max_seq_len") or model.get("seq_len")
    if seq_len is None:
        raise TrainConfigError("no sequence length: set train_seq_len or model.max_seq_len", path=path)
    budgets = data.get("target_budget"), data.get("experiment_budget")
    ratio = None
    if None not in budgets:
        target, experiment = (_int(b, k, path, 1) for b, k in zip(budgets, ("data.target_budget",
                                                                           "data.experiment_budget")))
        if experiment > target:
            raise TrainConfigError("data.experiment_budget exceeds data.target_budget", path=path)
        ratio = experiment / target
    named = {k: _mapping(data.get(k) or {}, f"data.{k}", path) for k in ("num_validation_sequences",
                                                                         "max_train_batches")}
    if ratio is not None and (named["num_validation_sequences"] or named["max_train_batches"]):
        raise TrainConfigError("data.target_budget/experiment_budget cannot be set with max_train_batches or "
                               "num_validation_sequences (Levanter refuses that too)", path=path)
    for key, table in named.items():
        for name, n in table.items():
            if name not in components:
                raise TrainConfigError(f"data.{key} names {name!r}, which is not a component", path=path)
            _int(n, f"data.{key}.{name}", path)
    data_seed = config.get("data_seed")
    steps = trainer.get("num_train_steps")
    return LevanterRun(
        components=components, stages=_stages(data, components, path),
        block_size=_int(data.get("mixture_block_size", 2048), "data.mixture_block_size", path, 1),
        shuffle=_shuffle(data, path), stop_strategy=strategy, validation=named["num_validation_sequences"],
        shuffle_before_split=bool(data.get("shuffle_before_trainval_split", True)),
        max_train_batches=named["max_train_batches"], budget_ratio=ratio,
        seed=_seed(trainer.get("seed", 0), "trainer.seed", path), batch=_batch(trainer, path),
        data_seed=None if data_seed is None else _seed(data_seed, "data_seed", path),
        seq_len=_int(seq_len, "the sequence length", path, 1),
        num_train_steps=None if steps is None else _int(steps, "trainer.num_train_steps", path, 1))


def load_run(path: str) -> LevanterRun:
    """Read and parse a ``train_lm`` YAML file (at most 64 MiB)."""
    import yaml

    try:
        with open(path, "rb") as f:
            text = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise TrainConfigError(f"cannot read the run's YAML: {e.strerror}", path=path) from None
    if len(text) > MAX_YAML_BYTES:
        raise TrainConfigError(f"larger than {MAX_YAML_BYTES} bytes", path=path)
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TrainConfigError(f"not valid YAML: {str(e).splitlines()[0]}", path=path) from None
    return parse_run(config, path)
