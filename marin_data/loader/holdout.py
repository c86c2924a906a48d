"""Held-out sequences: which windows of a subset form the validation stream, and never the training one.

A fraction ``f`` is realised as *one held-out window in every run of* ``every = round(1/f)`` *consecutive
windows*, at a keyed offset inside the run. Why this and not "hash each window and keep those below f":

- the map between a training index and its window is O(1) arithmetic both ways, so the training stream
  stays a pure function with no per-window table, and the counts are exact (``n_val`` is known up front);
- held-out windows are spread evenly through every shard, so validation samples the whole subset and
  reading them keeps the shuffle's locality;
- the offsets are keyed by the subset name only, not by the training seed: the held-out set is a property
  of the data, so runs with different seeds are evaluated on the same sequences and never train on
  each other's validation data.

Runs are counted over the subset's windows in order, across shard ends. The trailing partial run (fewer
than ``every`` windows) holds nothing out. A held-out window shares one token with each neighbour in its
shard (windows overlap by one token, see `packing`), so a training sequence may have the first token of a
validation sequence as its last label: 1 token in ``seq_len + 1``, by design.
"""

from __future__ import annotations

import numba
import numpy as np

from marin_data.loader.shuffle.keys import sub_key

__all__ = ["holdout_every", "held_before", "train_windows", "val_windows", "train_window1",
           "val_window1", "train_indices"]


def holdout_every(val_fraction: float) -> int:
    """``every`` for a validation fraction: one window in ``every`` is held out; 0 means none."""
    if not 0 <= val_fraction <= 0.5:
        raise ValueError(f"val_fraction must lie in [0, 0.5], got {val_fraction}")
    return 0 if val_fraction == 0 else max(2, round(1 / val_fraction))


@numba.njit(cache=True, inline="always")
def _offset(key, run, every):
    return np.int64(sub_key(key, np.uint64(run)) % np.uint64(every))


@numba.njit(cache=True, inline="always")
def train_window1(u, windows, every, key):
    """The window of training index ``u`` (jitted callers; `train_windows` for arrays)."""
    if every == 0:
        return u
    full = windows // every  # runs that hold one window out
    run, o = divmod(u, every - 1)
    if run < full:
        return run * every + o + (1 if o >= _offset(key, run, every) else 0)
    return full * every + (u - full * (every - 1))  # the trailing partial run holds nothing out


@numba.njit(cache=True, nogil=True)
def _train_indices(w, windows, every, key):
    out = np.empty(w.shape[0], np.int64)
    for k in range(w.shape[0]):
        if every == 0:
            out[k] = w[k]
            continue
        full = windows // every
        run, o = divmod(w[k], every)
        if run >= full:  # the trailing partial run holds nothing out
            out[k] = full * (every - 1) + (w[k] - full * every)
            continue
        held = _offset(key, run, every)
        out[k] = -1 if o == held else run * (every - 1) + o - (1 if o > held else 0)
    return out


def train_indices(w: np.ndarray, windows: int, every: int, key: int) -> np.ndarray:
    """The inverse of `train_windows`: the training index of each window ``w`` (``[k]`` int64), -1 for a
    held-out window."""
    return _train_indices(np.ascontiguousarray(w, dtype=np.int64), int(windows), int(every), np.uint64(key))


@numba.njit(cache=True, inline="always")
def val_window1(v, every, key):
    """The window of held-out index ``v`` (jitted callers; `val_windows` for arrays)."""
    return v * every + _offset(key, v, every)


@numba.njit(cache=True, nogil=True)
def _held_before(w, windows, every, key):
    out = np.zeros(w.shape[0], np.int64)
    if every == 0:
        return out
    full = windows // every
    for k in range(w.shape[0]):
        run, o = divmod(w[k], every)
        out[k] = min(run, full) + (1 if run < full and _offset(key, run, every) < o else 0)
    return out


def held_before(w: np.ndarray, windows: int, every: int, key: int) -> np.ndarray:
    """Held-out windows among windows ``[0, w)``, for each ``w`` (``[k]`` int64 in ``[0, windows]``).

    So windows ``[a, b)`` hold ``held_before(b) - held_before(a)`` held-out and the rest training ones: the
    loader counts each shard's training and held-out sequences this way, without a per-window table.
    """
    return _held_before(np.ascontiguousarray(w, dtype=np.int64), int(windows), int(every), np.uint64(key))


@numba.njit(cache=True, nogil=True)
def _train(u, windows, every, key):
    out = np.empty(u.shape[0], np.int64)
    for k in range(u.shape[0]):
        out[k] = train_window1(u[k], windows, every, key)
    return out


@numba.njit(cache=True, nogil=True)
def _val(v, every, key):
    out = np.empty(v.shape[0], np.int64)
    for k in range(v.shape[0]):
        out[k] = val_window1(v[k], every, key)
    return out


def train_windows(u: np.ndarray, windows: int, every: int, key: int) -> np.ndarray:
    """Window ids of training indices ``u`` (``[k]`` int64 in ``[0, n_train)``) of a subset."""
    return _train(np.ascontiguousarray(u, dtype=np.int64), int(windows), int(every), np.uint64(key))


def val_windows(v: np.ndarray, every: int, key: int) -> np.ndarray:
    """Window ids of held-out indices ``v`` (``[k]`` int64 in ``[0, n_val)``) of a subset."""
    if not every:
        raise ValueError("no windows are held out (val_fraction=0)")
    return _val(np.ascontiguousarray(v, dtype=np.int64), int(every), np.uint64(key))
