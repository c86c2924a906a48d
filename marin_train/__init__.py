"""Training the Marin MoE model on a Marin corpus: the only package that imports both marin_data and marin_model.

``config`` (the run's dataclasses and presets), ``distributed`` (the process group), ``checkpoint``,
``loop`` (the optimizer steps), ``data`` (the loader a run reads), ``cli`` (``marin-train``).
"""
