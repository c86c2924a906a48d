"""Training the Marin MoE model on a Marin corpus: the only package that imports both marin_data and marin_model.

``config`` (the run's dataclasses and presets), ``distributed`` (the process group), ``parallel`` (the device
mesh, FSDP2 and expert parallelism), ``checkpoint`` (sharded DCP checkpoints), ``loop`` (the optimizer steps),
``data`` (the loader a run reads), ``schedule`` (a run's data schedule file), ``threads`` (torch's intra-op
threads), ``metrics`` (the per-step record, ``metrics.jsonl``, TensorBoard and W&B), ``plot`` (a run's metrics
as a PNG), ``evaluate`` (held-out loss and bits per byte), ``export`` (a checkpoint as one safetensors model,
and any saved model loaded back), ``inference`` (evaluating and sampling a saved model), ``plan`` (memory and
FLOPs of a layout), ``cli`` (``marin-train``).
"""
