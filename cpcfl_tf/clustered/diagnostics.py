"""Why a clustered run merges groups: what the clients saw when they chose, and when a
merge became final (docs/experiments.md, "Reading the selection diagnostic").

At the round the clients first choose a model by their loss (round Tc + 1 for CP-CFL,
round 1 for IFCA) and a few rounds after, a run made with ``diagnose = K`` records in
its round records each participant's loss on every pool model and its *margin*: the
second-lowest loss minus the lowest. A margin near zero means the client's choice was
nearly a coin toss between two models: the situation in which two groups can end up on
one model. After the run, :func:`merges` reads from the rounds' cluster ids which true
groups ended on one model and from which round on they shared it for good.

The losses are the simulator's observation, not a message: a client picks its model from
them and sends back only its cluster id, as in every run (a Flower server never sees
them, so the Flower apps do not record the diagnostic).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def margins(losses: np.ndarray) -> np.ndarray:
    """``(clients,)`` second-lowest minus lowest loss of each row of ``losses (clients,
    N)``; 0 for a single model."""
    losses = np.asarray(losses, np.float64)
    if losses.shape[1] < 2:
        return np.zeros(len(losses))
    two = np.sort(losses, axis=1)[:, :2]
    return two[:, 1] - two[:, 0]


def selection_record(clients: np.ndarray, losses: np.ndarray) -> dict:
    """What a round's record keeps of the clients' choice (``selection``): the
    participants, their losses on every pool model and their margins."""
    losses = np.asarray(losses, np.float64)
    return {
        "clients": [int(c) for c in clients],
        "losses": [[float(v) for v in row] for row in losses],
        "margins": [float(v) for v in margins(losses)],
    }


def diagnosed(round_: int, head_rounds: int, rounds: int) -> bool:
    """Whether round ``round_`` (0-based) is one of the ``rounds`` diagnosed ones: the
    first in which the clients choose by loss (``head_rounds``, 0-based) and those after."""
    return head_rounds <= round_ < head_rounds + rounds


def majority(cluster_ids: Sequence[int], groups: np.ndarray) -> dict[int, int]:
    """Each true group's model: the cluster id more than half of its clients have
    (clients that have not taken part, -1, left out); a group without one is left out."""
    ids, groups = np.asarray(cluster_ids), np.asarray(groups)
    found = {}
    for g in np.unique(groups):
        taken = ids[(groups == g) & (ids >= 0)]
        if len(taken):
            counts = np.bincount(taken)
            if 2 * counts.max() > len(taken):
                found[int(g)] = int(counts.argmax())
    return found


def merges(groups: np.ndarray, history: Sequence[Sequence[int]]) -> list[dict]:
    """The merges a run ended with: for each model that two or more true groups hold at
    the end (by :func:`majority`), the groups, the model and ``final_from``, the first
    round (1-based) from which those groups shared one model in every later round.

    ``history`` is the cluster ids of every round of the final attempt, in order (the
    run record's ``rounds``)."""
    if not len(history):
        return []
    by_round = [majority(ids, groups) for ids in history]
    end = by_round[-1]
    found = []
    for model in sorted(set(end.values())):
        held = sorted(g for g, m in end.items() if m == model)
        if len(held) < 2:
            continue
        first = len(by_round)
        while first > 0 and _together(by_round[first - 1], held):
            first -= 1
        found.append({"groups": held, "model": model, "final_from": first + 1})
    return found


def _together(models: dict[int, int], held: list[int]) -> bool:
    return all(g in models for g in held) and len({models[g] for g in held}) == 1
