"""Measuring what a call holds at its peak: Python's allocations (``tracemalloc``) plus Arrow's, which
``tracemalloc`` does not see (Arrow allocates from its own pool)."""

from __future__ import annotations

import tracemalloc

import pyarrow as pa

_POOLS: list = []  # kept alive: memory Arrow allocated from a pool may be freed long after the call


def peak_bytes(fn) -> tuple[object, int]:
    """``fn()``'s result (or the exception it raised) and the peak of Python and Arrow allocations while it ran."""
    pool, before = pa.proxy_memory_pool(pa.default_memory_pool()), pa.default_memory_pool()
    _POOLS.append(pool)
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out = e
        return out, tracemalloc.get_traced_memory()[1] + pool.max_memory()
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(before)
