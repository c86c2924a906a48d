"""Levanter's training order in numpy, without JAX: which sequence of which cache a ``train_lm`` run reads at
each step, and the way back (docs/what-did-the-model-see.md).

One concept per module, each pure: `threefry` (JAX's keys and random bits), `jaxperm`
(``jax.random.permutation``), `shuffle` (Levanter's component shuffles), `mixture` (``MixtureDataset``),
`schedule` (``BatchSchedule``), `config` (the YAML keys that decide the order), `run` (their composition),
`trace` (steps and documents, from the caches' ledgers and offsets).
"""
