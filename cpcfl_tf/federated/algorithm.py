"""The clustered-FL algorithm as small functions over an explicit state.

Algorithm "CP-CFL" of the paper, written the way FedJAX writes HypCluster: the server
state is a pool of N models (weight lists); a round is *selection* (each client picks a
cluster), *local training* (done by a backend, elsewhere) and *aggregation* (each
cluster's model becomes the |D_u|-weighted average of its members, Eq. weighted_avg).
Nothing here knows how models are trained, so the simulator and a real federation
(Flower) share these functions.

Weights are lists of numpy arrays in the order of ``classifier.get_weights()``:
first the encoder's ``num_encoder`` arrays, then the head's.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Sequence

import numpy as np

Weights = list[np.ndarray]


class Stream(enum.IntEnum):
    """What a round's random draws are for. Each has its own generator, seeded by (run
    seed, attempt, round, stream) and nothing else, so a resumed run, or a Flower node on
    another machine, draws exactly what an uninterrupted simulation draws."""

    SELECTION = 0
    """Who takes part, the random picks during Tc, and tie-breaks between equal losses."""
    BATCHES = 1
    """Each client's batch order (:func:`cpcfl_tf.federated.backends.batch_orders`)."""


def stream_seed(seed: int, attempt: int, round_: int, stream: Stream) -> list[int]:
    """The seed words of ``stream`` in round ``round_`` (0-based) of restart ``attempt``."""
    return [seed, attempt, round_, int(stream)]


def round_rng(seed: int, attempt: int, round_: int, stream: Stream) -> np.random.Generator:
    """The generator of ``stream`` in round ``round_`` of restart ``attempt``."""
    return np.random.default_rng(stream_seed(seed, attempt, round_, stream))


def init_seed(seed: int, attempt: int, model: int) -> int:
    """Seed of the initial weights of pool model ``model`` in restart ``attempt`` (IFCA's
    restarts draw new models; the numbers only need to differ)."""
    return seed * 1_000_003 + attempt * 1_009 + model


@dataclasses.dataclass
class ServerState:
    """What the server holds between rounds."""

    round: int
    """Finished rounds."""
    models: list[Weights]
    """The pool of N cluster models."""
    num_encoder: int
    """How many leading arrays of each weight list belong to the encoder."""


def select_clusters(losses: np.ndarray | None, num_models: int, explore: bool,
                    rng: np.random.Generator, num_clients: int | None = None) -> np.ndarray:
    """Cluster identity of each client (Eq. cluster_identity).

    Parameters
    ----------
    losses
        ``(clients, N)`` loss of every pool model on each client's *training* data;
        unused (may be ``None``) while exploring.
    num_models
        N.
    explore
        ``t < Tc``: each client picks a model uniformly at random.
    rng
        Source of the random picks and of tie-breaking.
    num_clients
        Needed when ``losses`` is ``None``.
    """
    if explore:
        count = num_clients if losses is None else losses.shape[0]
        return rng.integers(0, num_models, size=count)
    # argmin with ties broken at random: add a random order to exact ties only.
    best = losses.min(axis=1, keepdims=True)
    tied = losses == best
    keys = np.where(tied, rng.random(losses.shape), np.inf)
    return np.argmin(keys, axis=1)


def weighted_average(stacked: Sequence[np.ndarray], sizes: Sequence[float]) -> Weights:
    """``sum_u |D_u| phi_u / sum_u |D_u|`` for each array, accumulated in float64.

    ``stacked[i]`` holds array i of every member, stacked on a leading axis.
    """
    share = np.asarray(sizes, np.float64) / float(np.sum(sizes))
    return [np.tensordot(share, a.astype(np.float64), axes=1).astype(a.dtype) for a in stacked]


def aggregate(state: ServerState, client_weights: Sequence[np.ndarray], cluster_ids: np.ndarray,
              sizes: Sequence[float], *, global_encoder: bool = False) -> ServerState:
    """New pool: each cluster's model is the weighted average of its members.

    Parameters
    ----------
    state
        The pool the clients started from.
    client_weights
        The clients' trained weights, array by array, each stacked over clients
        (``client_weights[i][u]`` is array i of client u).
    cluster_ids, sizes
        Each client's cluster identity and number of training examples.
    global_encoder
        Average the encoder part over *all* clients and share it between every cluster
        model (the paper's "global encoder" variant); heads stay per cluster.

    A cluster nobody chose keeps its weights.
    """
    sizes = np.asarray(sizes, np.float64)
    models = []
    for n, old in enumerate(state.models):
        members = np.flatnonzero(cluster_ids == n)
        models.append(old if len(members) == 0 else
                      weighted_average([a[members] for a in client_weights], sizes[members]))
    if global_encoder:
        k = state.num_encoder
        encoder = weighted_average(client_weights[:k], sizes)
        models = [encoder + m[k:] for m in models]
    return ServerState(state.round + 1, models, state.num_encoder)


def should_restart(fl, finished_round: int, attempt: int, cluster_ids: np.ndarray) -> bool:
    """IFCA's restart rule: after ``fl.restart_round`` rounds, an IFCA run whose clustering
    failed starts over with new random models, at most ``fl.max_restarts`` times. CP-CFL and
    FedAvg never restart (the paper gives CP-CFL no restart rule)."""
    return (fl.method == "ifca" and finished_round == fl.restart_round
            and attempt < fl.max_restarts
            and clustering_failed(cluster_ids, fl.num_clusters, fl.min_cluster_share))


def clustering_failed(cluster_ids: np.ndarray, num_models: int, min_share: float) -> bool:
    """IFCA's failure: one model taken by every client, or a cluster whose share of
    clients is below ``min_share`` of the fair share ``1/N`` (README, choices)."""
    if num_models == 1:
        return False
    counts = np.bincount(cluster_ids, minlength=num_models)
    return bool(counts.max() == len(cluster_ids)
                or counts.min() < min_share * len(cluster_ids) / num_models)


def model_bytes(weights: Weights) -> int:
    """Size S of one model as sent: the bytes of its arrays."""
    return int(sum(w.nbytes for w in weights))


def round_bytes(num_clients: int, num_models: int, size: int) -> tuple[int, int]:
    """Bytes down and up in one round: the pool of N models to every participating
    client, one model back from each (Eqs. comm_cost_fedavg / comm_cost_cfl: 2S and
    (N+1)S per client per round)."""
    return num_clients * num_models * size, num_clients * size
