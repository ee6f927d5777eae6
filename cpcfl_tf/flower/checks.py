"""What a federation's server checks in every reply before it counts, and a node in every
model it is sent: a node is not trusted (docs/flower.md, "What is and is not secured").

Each function returns what is wrong, in a few words for the log line that names the node,
or None. Pure NumPy: the ServerApp (:mod:`cpcfl_tf.flower.server_app`) leaves a reply that
fails out of its round exactly as a failed node's (its cluster id kept), and the ClientApp
(:mod:`cpcfl_tf.flower.client_app`) answers a bad message with an error instead of
training on it.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np


def weights_problem(arrays: Sequence[np.ndarray], like: Sequence[np.ndarray]) -> str | None:
    """``arrays`` against the model ``like`` they should be: their number, each one's shape
    and dtype, and every value finite."""
    if len(arrays) != len(like):
        return f"{len(arrays)} weight arrays where the model has {len(like)}"
    for i, (got, want) in enumerate(zip(arrays, like)):
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape:
            return f"weight array {i} has shape {got.shape}, the model's {want.shape}"
        if got.dtype != want.dtype:
            return f"weight array {i} is {got.dtype}, the model's {want.dtype}"
        if not np.isfinite(got).all():
            return f"weight array {i} holds non-finite values"
    return None


def count_problem(value: Any, most: int | None) -> str | None:
    """An example count: a positive integer, at most ``most`` (None: no bound known)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return f"example count {value!r} is not a number"
    if not math.isfinite(number) or number != int(number) or number < 1:
        return f"example count {value!r} is not a positive integer"
    if most is not None and number > most:
        return f"example count {int(number)} is more than the node's {most} examples"
    return None


def cluster_problem(value: Any, num_models: int, expected: int | None = None) -> str | None:
    """A cluster id: an integer inside the pool (and ``expected``, where the server
    assigned the model or drew it for the Tc phase)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return f"cluster id {value!r} is not a number"
    if number != int(number) or not 0 <= number < num_models:
        return f"cluster id {value!r} is outside the pool 0..{num_models - 1}"
    if expected is not None and int(number) != expected:
        return f"cluster id {int(number)} is not the model {expected} it was given to train"
    return None


def accuracy_problem(value: Any) -> str | None:
    """A scoring reply's accuracy: a number in [0, 1]."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return f"accuracy {value!r} is not a number"
    if not 0.0 <= number <= 1.0:  # NaN fails too
        return f"accuracy {value!r} is outside [0, 1]"
    return None


def loss_problem(value: Any) -> str | None:
    """A pre-training reply's loss (the round's history averages it): a finite number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        return f"loss {value!r} is not a finite number"
    return None


def client_problem(value: Any, client: int) -> str | None:
    """The client id a reply names against the client the server asked that node for."""
    try:
        said = int(value)
    except (TypeError, ValueError):
        return f"client id {value!r} is not a number"
    if said != client:
        return f"it answers as client {said}, the node is client {client}"
    return None


def first(*problems: str | None) -> str | None:
    """The first of ``problems`` that is not None."""
    return next((p for p in problems if p is not None), None)
