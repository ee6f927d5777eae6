"""The computations the clustering rules (:mod:`cpcfl_tf.methods.rules`) are made of,
each a function of arrays: FeSEM's centres, CFL's bipartition, FL+HC's hierarchy, PACFL's
data subspaces and principal angles, FedGroup's decomposed cosines, k-means++. Pure NumPy
(and scikit-learn's clustering); it imports nothing of the kit."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np


class RuleSettings(Protocol):
    """What a rule reads of a run's ``federated`` section as its method runs it
    (:class:`~cpcfl_tf.plan.resolve.ResolvedFederated`: N, Tc and the options as used)."""

    @property
    def num_clusters(self) -> int: ...

    @property
    def head_rounds(self) -> int: ...

    @property
    def options(self) -> dict[str, float] | None: ...


class PoolState(Protocol):
    """What a rule reads of the server's state between rounds
    (:class:`~cpcfl_tf.clustered.algorithm.ServerState`, a dataclass a rule may replace
    fields of)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def round(self) -> int: ...

    @property
    def models(self) -> list[list[np.ndarray]]: ...

    @property
    def assignment(self) -> np.ndarray | None: ...

    @property
    def memory(self) -> dict[str, np.ndarray]: ...


class RoundReplies(Protocol):
    """What a rule reads of a round's replies
    (:class:`~cpcfl_tf.clustered.algorithm.Replies`): who replied, the cluster each
    trained, its example count and its weights, array by array stacked over the replies."""

    @property
    def clients(self) -> np.ndarray: ...

    @property
    def cluster_ids(self) -> np.ndarray: ...

    @property
    def sizes(self) -> np.ndarray: ...

    @property
    def weights(self) -> list[np.ndarray]: ...


Answers = Sequence[np.ndarray | None]
"""Each client's answer to what its rule asks before training, by client id (None: a
Flower node that gave none the server could use, which takes no part)."""

State = TypeVar("State", bound=PoolState)
"""The server state a rule's step is given and gives back (the same type)."""


def assigned(state: PoolState) -> np.ndarray:
    """The server's assignment in ``state``, which a rule that assigns always keeps."""
    if state.assignment is None:
        raise ValueError("the pool keeps no assignment: the rule does not assign")
    return state.assignment


def nearest_centres(
    centres: list[list[np.ndarray]], client_weights: Sequence[np.ndarray]
) -> np.ndarray:
    """FeSEM's E-step: for each client (``client_weights[i][u]``: array i of client u) the
    centre at the least squared L2 distance over all arrays, in float64 (ties: the lower id)."""
    count = len(client_weights[0])
    distance = np.zeros((count, len(centres)))
    for i, stacked in enumerate(client_weights):
        flat = stacked.reshape(count, -1).astype(np.float64)
        for n, centre in enumerate(centres):
            distance[:, n] += np.square(flat - centre[i].reshape(-1).astype(np.float64)).sum(1)
    return np.argmin(distance, axis=1)


def farthest_first(client_weights: Sequence[np.ndarray], count: int) -> list[list[np.ndarray]]:
    """FeSEM's first centres: ``count`` of the clients' trained models, chosen by
    farthest-first traversal (the one farthest from their mean, then each time the one
    farthest from the centres chosen), squared L2 over all arrays, in float64. Seedless:
    the same replies give the same centres."""
    clients = len(client_weights[0])
    flat = np.concatenate([a.reshape(clients, -1).astype(np.float64) for a in client_weights], 1)
    chosen = [int(np.argmax(np.square(flat - flat.mean(0)).sum(1)))]
    while len(chosen) < min(count, clients):
        nearest = np.min([np.square(flat - flat[c]).sum(1) for c in chosen], axis=0)
        chosen.append(int(np.argmax(nearest)))
    return [[a[c] for a in client_weights] for c in chosen]


def fesem_step(state: PoolState, replies: RoundReplies) -> np.ndarray:
    """FeSEM's E-step (Long et al.): each trained model joins the nearest centre. The
    centres are the models the round started from, except in round 1, where every client
    trained the one common model and the centres are :func:`farthest_first` of the trained
    models (docs/choices.md)."""
    if state.round == 0:
        centres = farthest_first(replies.weights, len(state.models))
    else:
        centres = state.models
    return nearest_centres(centres, replies.weights)


def flat_updates(state: PoolState, replies: RoundReplies) -> np.ndarray:
    """``(replies, parameters)`` float64: each reply's trained weights minus the model it
    started from, every array flattened (what CFL compares)."""
    ids = replies.cluster_ids
    return np.concatenate(
        [
            (
                stacked.reshape(len(ids), -1).astype(np.float64)
                - np.stack([state.models[c][i].reshape(-1) for c in ids]).astype(np.float64)
            )
            for i, stacked in enumerate(replies.weights)
        ],
        axis=1,
    )


def bipartition(updates: np.ndarray) -> tuple[np.ndarray, float]:
    """CFL's split of one cluster: complete-linkage agglomerative clustering of the
    members' updates into two, by cosine similarity (the authors' code); 0/1 per member,
    and the largest cosine similarity between an update of one part and one of the other
    (Sattler et al.'s alpha_cross^max: low when the parts pull apart)."""
    from sklearn.cluster import AgglomerativeClustering

    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    unit = updates / np.where(norms > 0, norms, 1.0)
    similarity = unit @ unit.T
    halves = (
        AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
        .fit(-similarity)
        .labels_
    )
    return halves, float(similarity[np.ix_(halves == 0, halves == 1)].max())


def cfl_split(
    fl: RuleSettings, state: State, replies: RoundReplies
) -> tuple[np.ndarray, State, dict]:
    """CFL's server step (Sattler et al., Algorithm 1) before aggregation: a cluster whose
    |D_u|-weighted mean update is below ``eps1`` while its largest update is above
    ``eps2`` (after ``split_after`` rounds, with at least ``min_split_size`` members) is
    split in two by :func:`bipartition` while a free pool slot is left, if the two parts'
    largest cross similarity is below ``max_cross`` (1: no such guard, as in the authors'
    code); the new cluster starts from its parent's model. Returns the replies' cluster
    ids, the pool, and the round record's ``split_test``: for every cluster that trained,
    the three numbers the test compares (how the thresholds were calibrated)."""
    options, ids = fl.options or {}, replies.cluster_ids.copy()
    if len(ids) == 0:
        return ids, state, {}
    updates = flat_updates(state, replies)
    norms = np.linalg.norm(updates, axis=1)
    used = set(np.unique(assigned(state)).tolist()) | set(ids.tolist())
    models = list(state.models)
    tests = {}
    for c in sorted(set(ids.tolist())):
        members = np.flatnonzero(ids == c)
        share = replies.sizes[members] / replies.sizes[members].sum()
        mean, top = float(np.linalg.norm(share @ updates[members])), float(norms[members].max())
        halves, cross = bipartition(updates[members]) if len(members) > 1 else (None, None)
        tests[str(c)] = {"mean_norm": mean, "max_norm": top, "cross_similarity": cross}
        free = [n for n in range(len(models)) if n not in used]
        if (
            state.round < options["split_after"]
            or not free
            or len(members) < options["min_split_size"]
        ):
            continue
        if halves is None or cross is None:  # one member: nothing to split
            continue
        if mean < options["eps1"] and top > options["eps2"] and cross < options["max_cross"]:
            new = free[0]
            ids[members[halves == 1]] = new
            models[new] = [np.array(a) for a in models[c]]
            used.add(new)
    return ids, dataclasses.replace(state, models=models), {"split_test": tests}


def hierarchical_clusters(updates: np.ndarray, num_clusters: int) -> np.ndarray:
    """FL+HC's one clustering: agglomerative clustering of the clients' updates with
    Ward's linkage on Euclidean distance, into ``num_clusters`` (docs/choices.md)."""
    from sklearn.cluster import AgglomerativeClustering

    count = min(num_clusters, len(updates))
    if count < 2:
        return np.zeros(len(updates), np.int64)
    return AgglomerativeClustering(n_clusters=count, linkage="ward").fit(updates).labels_


def fl_hc_split(fl: RuleSettings, state: State, replies: RoundReplies) -> tuple[np.ndarray, State]:
    """FL+HC's server step (Briggs et al. 2020): FedAvg until round ``cluster_round``
    (0-based), whose updates (from the one global model) are clustered once by
    :func:`hierarchical_clusters`; every cluster model starts from the global model.
    Clients not taking part in that round stay with cluster 0."""
    ids = replies.cluster_ids
    if state.round != (fl.options or {})["cluster_round"] or len(ids) == 0:
        return ids, state
    ids = hierarchical_clusters(flat_updates(state, replies), fl.num_clusters)
    models = [[np.array(a) for a in state.models[0]] for _ in state.models]
    return ids.astype(np.int64), dataclasses.replace(state, models=models)


def data_subspace(images: np.ndarray, basis: int) -> np.ndarray:
    """A PACFL client's message (Vahidian et al. 2023, Sec. 3): the ``basis`` leading left
    singular vectors of its data matrix (pixels in [0, 1] by examples), ``(d, basis)``
    float32. Computed once, on the client's training data."""
    matrix = images.reshape(len(images), -1).astype(np.float64).T / 255.0
    left = np.linalg.svd(matrix, full_matrices=False)[0]
    return left[:, :basis].astype(np.float32)


def sent_bytes(answers: Answers | None) -> int:
    """The bytes of the arrays the clients sent as answers (0: none asked; a client
    without one sent nothing the server kept)."""
    return 0 if answers is None else int(sum(a.nbytes for a in answers if a is not None))


def mean_embedding(embeddings: np.ndarray) -> np.ndarray:
    """The mean of a client's embeddings, each scaled to unit length first (SimCLR and its
    kin compare representations by their cosine), in float32."""
    flat = np.asarray(embeddings, np.float64).reshape(len(embeddings), -1)
    norms = np.linalg.norm(flat, axis=1, keepdims=True)
    return (flat / np.where(norms > 0, norms, 1.0)).mean(0).astype(np.float32)


def principal_angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The principal angles (radians, ascending) between the spans of two orthonormal
    bases: the arccos of the singular values of ``a.T @ b``."""
    cosines = np.linalg.svd(a.astype(np.float64).T @ b.astype(np.float64), compute_uv=False)
    return np.sort(np.arccos(np.clip(cosines, -1.0, 1.0)))


def subspace_clusters(subspaces: Sequence[np.ndarray], num_clusters: int) -> np.ndarray:
    """PACFL's server step: the proximity of two clients is the sum of the principal
    angles between their data subspaces; average-linkage agglomerative clustering of that
    matrix into ``num_clusters`` (docs/choices.md says why the sum and why N)."""
    from sklearn.cluster import AgglomerativeClustering

    count = len(subspaces)
    proximity = np.zeros((count, count))
    for i in range(count):
        for j in range(i + 1, count):
            proximity[i, j] = proximity[j, i] = principal_angles(subspaces[i], subspaces[j]).sum()
    if min(num_clusters, count) < 2:
        return np.zeros(count, np.int64)
    return (
        AgglomerativeClustering(
            n_clusters=min(num_clusters, count), metric="precomputed", linkage="average"
        )
        .fit(proximity)
        .labels_.astype(np.int64)
    )


def leading_directions(updates: np.ndarray, count: int) -> np.ndarray:
    """``(count, parameters)``: the leading right singular vectors of the updates (one per
    row), unit length, float64 (FedGroup's decomposition of the update matrix)."""
    directions = np.linalg.svd(updates, full_matrices=False)[2]
    return directions[: min(count, len(directions))]


def decomposed_cosines(updates: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """``(updates, directions)``: the cosine of each update with each direction (FedGroup's
    decomposed cosine similarity; the Euclidean distance between two rows is its EDC)."""
    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    return (updates / np.where(norms > 0, norms, 1.0)) @ directions.T


def kmeans_pp(points: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """k-means with k-means++ seeding (scikit-learn, ten seedings from the fixed seed 0, so
    the same replies give the same groups): each point's group and the group centres."""
    from sklearn.cluster import KMeans

    count = min(count, len(points))
    if count < 2:
        return np.zeros(len(points), np.int64), points.mean(0, keepdims=True)
    fit = KMeans(n_clusters=count, init="k-means++", n_init=10, random_state=0).fit(points)
    return fit.labels_.astype(np.int64), fit.cluster_centers_
