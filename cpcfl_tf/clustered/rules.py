"""How a clustered-FL method puts its clients in clusters: one object per rule.

A :class:`Rule` says, in one place, everything a rule does besides the round itself
(:mod:`cpcfl_tf.clustered.algorithm`):

- ``num_models``: how many models the pool holds (N);
- ``asks``, ``question``, ``answer``: what the server asks each client once before
  training, with which settings, and how the client answers from its own training data
  (PACFL's data subspace, the oracle's true group);
- ``answer_bytes``: what those answers add to the bytes sent up (``bytes_other``);
- ``first``: each client's first model when the server assigns, from the answers;
- ``step``: the server's step after a round's replies, before aggregation: the cluster of
  each reply, the pool it aggregates into, and what the round's record gains;
- ``server_assigns``, ``communicates``: whether the server tells each client its model
  (then sends it that one model) and whether anything is sent at all.

:data:`RULES` names them; a method (:mod:`cpcfl_tf.clustered.methods`) names its rule in
``Method.assign``. The algorithm, the simulator and both Flower apps call the rule and
never compare its name. Pure NumPy (and scikit-learn's clustering): the server state and
replies are read by their fields (``round``, ``models``, ``assignment``, ``memory``, the
rule's own arrays kept between rounds; ``clients``, ``cluster_ids``, ``sizes``,
``weights``), so this module imports nothing of the kit but its errors and the plugin
loader, and sits below the config.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from cpcfl_tf.errors import UserError
from cpcfl_tf.plugins import entries


class Rule:
    """The rule every method whose clients choose by their loss follows (IFCA's family):
    nothing is asked first, each client picks the pool model of lowest training loss
    (random picks in the Tc phase), the server averages by the choices."""

    name = "loss"
    description = ("each client picks the pool model with the lowest loss on its own "
                   "training data (Eq. cluster_identity); random picks in the Tc phase")
    asks: str | None = None
    """What the server asks each client once before training (None: nothing)."""
    reads = "images"
    """What :meth:`answer` is given of a client's training data: its ``images`` (uint8),
    or their ``embeddings`` by the frozen starting encoder."""
    on_flower = True
    """Whether the Flower apps can run the rule (one whose question needs the starting
    encoder on the nodes cannot yet: :class:`FeatureGroups`)."""
    node_needs = ""
    """What a Flower node must be started with to answer (said when one did not)."""
    server_assigns = False
    communicates = True

    def num_models(self, num_clusters: int, num_clients: int, num_groups: int) -> int:
        """N of a run with ``federated.num_clusters`` = ``num_clusters``."""
        return num_clusters

    def question(self, fl) -> dict:
        """The settings the server sends with its question (e.g. PACFL's ``basis``)."""
        return {}

    def answer(self, question: dict, images: np.ndarray, group: int | None) -> np.ndarray:
        """A client's answer to :attr:`asks` from its training ``images`` (uint8) and, where
        it knows it, its true ``group``."""
        raise ValueError(f"rule {self.name!r} asks the clients nothing")

    def answer_bytes(self, answers: Sequence[np.ndarray] | None) -> int:
        """Bytes the answers add to what the clients send up (``bytes_other``)."""
        return 0

    def first(self, fl, num_clients: int, answers: Sequence[np.ndarray] | None
              ) -> np.ndarray | None:
        """Each client's first model when the server assigns (None: each chooses)."""
        return None

    def step(self, fl, state, replies) -> tuple[np.ndarray, object, dict]:
        """The cluster of each reply the server aggregates by, the pool it aggregates into
        (``state``, possibly changed), and what the round's record gains."""
        return replies.cluster_ids, state, {}

    def remember(self, fl, answers: Sequence[np.ndarray] | None) -> dict[str, np.ndarray]:
        """What the server keeps from the answers for later rounds (``state.memory``)."""
        return {}

    def assignment(self, fl, t: int, state) -> np.ndarray | None:
        """Each client's model in round ``t`` (0-based) when the server gives it, else
        ``None`` (each chooses: at random in the Tc phase, then by loss)."""
        return state.assignment


class Own(Rule):
    name = "own"
    description = "each client keeps a model of its own; nothing is sent"
    server_assigns, communicates = True, False

    def num_models(self, num_clusters, num_clients, num_groups):
        return num_clients

    def first(self, fl, num_clients, answers):
        return np.arange(num_clients)


class TrueGroups(Rule):
    name = "groups"
    description = ("the server puts each client in its true group (which only this "
                   "reference method is told)")
    asks, server_assigns = "group", True
    node_needs = " with group=G in its node config"

    def num_models(self, num_clusters, num_clients, num_groups):
        return num_groups

    def answer(self, question, images, group):
        if group is None:
            raise UserError("the method needs this client's true group: add group=G to the "
                            "node config")
        return np.array([group], np.int64)

    def first(self, fl, num_clients, answers):
        if answers is None:
            raise ValueError("the oracle needs every client's true group")
        groups = np.array([int(a[0]) for a in answers])
        return np.unique(groups, return_inverse=True)[1].reshape(-1)


class OneFirst(Rule):
    """Rules whose first round trains one common model (pool model 0)."""

    server_assigns = True

    def first(self, fl, num_clients, answers):
        return np.zeros(num_clients, np.int64)


class Nearest(OneFirst):
    name = "nearest"
    description = ("the server puts each client's trained model in the cluster of the "
                   "nearest centre (squared L2 distance), and each centre becomes its "
                   "members' average")

    def step(self, fl, state, replies):
        if not len(replies.clients):
            return replies.cluster_ids, state, {}
        return fesem_step(state, replies), state, {}


class Split(OneFirst):
    name = "split"
    description = ("all clients start in one cluster; the server splits a cluster in two by "
                   "the cosine similarity of its members' updates once their mean is small "
                   "and the largest one large")

    def step(self, fl, state, replies):
        return cfl_split(fl, state, replies)


class Hierarchical(OneFirst):
    name = "hierarchical"
    description = ("FedAvg until a set round, whose updates the server clusters once "
                   "(agglomerative, Ward's linkage); FedAvg within each cluster after it")

    def step(self, fl, state, replies):
        return (*fl_hc_split(fl, state, replies), {})


class Subspaces(Rule):
    name = "subspaces"
    description = ("before training each client sends the leading singular vectors of its "
                   "data; the server clusters the clients once by the principal angles "
                   "between them; FedAvg within each cluster")
    asks, server_assigns = "subspace", True

    def question(self, fl):
        return {"basis": int(fl.options["basis"])}

    def answer(self, question, images, group):
        return data_subspace(images, int(question["basis"]))

    def answer_bytes(self, answers):
        return sent_bytes(answers)

    def first(self, fl, num_clients, answers):
        if answers is None:
            raise ValueError("PACFL needs the clients' data subspaces")
        return subspace_clusters(answers, fl.num_clusters)


class FeatureGroups(Rule):
    """Beyond the paper: CP-CFL's rule with the clients' first choice after the Tc phase
    made from the frozen encoder's features instead of from the still weak heads' losses
    (the cause of CP-CFL's merges: experiments/clustering_reliability.py). Before training
    each client sends the mean of its training images' embeddings (each scaled to unit
    length), the server groups the means with k-means, as k-FED groups the clients'
    local centres (Dennis, Li and Smith, "Heterogeneity for the Win: One-Shot Federated
    Clustering", ICML 2021), and in round Tc + 1 each group trains the pool model of its
    number; from round Tc + 2 each client chooses by loss as in CP-CFL. No round is
    added; what is sent besides weights is one vector per client (``bytes_other``), and
    the server learns each client's mean embedding."""

    name = "features"
    description = ("CP-CFL's choice by loss, but the first choice after the Tc phase is the "
                   "server's: k-means over the clients' mean embeddings by the frozen "
                   "encoder, sent once before training")
    asks, reads, on_flower = "features", "embeddings", False

    def answer(self, question, embeddings, group):
        return mean_embedding(embeddings)

    def answer_bytes(self, answers):
        return sent_bytes(answers)

    def remember(self, fl, answers):
        if answers is None:
            raise ValueError("the features rule needs the clients' mean embeddings")
        return {"feature_groups": kmeans_pp(np.stack(answers).astype(np.float64),
                                            fl.num_clusters)[0]}

    def assignment(self, fl, t, state):
        return state.memory["feature_groups"] if t == fl.head_rounds else state.assignment


class Decomposed(OneFirst):
    """FedGroup's rule (Duan et al. 2021, Sec. 4): a cold start, then static groups."""

    name = "decomposed"
    description = ("at the cold start (round 1, one common model) the server clusters the "
                   "clients' updates by the Euclidean distance of their decomposed cosine "
                   "similarity (cosines with the updates' leading singular directions), "
                   "k-means++ into N groups; each client stays in its group, FedAvg within "
                   "it; a client first seen later joins the group whose centre is nearest")

    def step(self, fl, state, replies):
        ids = replies.cluster_ids.copy()
        if not len(ids):
            return ids, state, {}
        updates = flat_updates(state, replies)
        memory = state.memory
        if "directions" not in memory:  # the cold start
            directions = leading_directions(updates, fl.num_clusters)
            coords = decomposed_cosines(updates, directions)
            groups, centres = kmeans_pp(coords, fl.num_clusters)
            grouped = np.zeros(len(state.assignment), bool)
            grouped[replies.clients] = True
            return groups, dataclasses.replace(state, memory={
                "directions": directions, "centres": centres, "grouped": grouped}), {}
        new = ~memory["grouped"][replies.clients]
        if new.any():  # newcomers join the nearest group centre
            coords = decomposed_cosines(updates[new], memory["directions"])
            distance = np.square(coords[:, None, :] - memory["centres"][None]).sum(-1)
            ids[new] = np.argmin(distance, axis=1)
            grouped = memory["grouped"].copy()
            grouped[replies.clients] = True
            state = dataclasses.replace(state, memory={**memory, "grouped": grouped})
        return ids, state, {}


RULES: dict[str, Rule] = {r.name: r for r in (Rule(), Own(), TrueGroups(), Nearest(), Split(),
                                                 Hierarchical(), Subspaces(), Decomposed(),
                                                 FeatureGroups())}
RULES.update(entries("cpcfl_tf.rules", Rule, RULES))
"""Every rule, by the name a method's ``assign`` gives: the kit's, then the installed
plugins' (:mod:`cpcfl_tf.plugins`)."""


def nearest_centres(centres: list[list[np.ndarray]], client_weights: Sequence[np.ndarray]) -> np.ndarray:
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


def fesem_step(state, replies) -> np.ndarray:
    """FeSEM's E-step (Long et al.): each trained model joins the nearest centre. The
    centres are the models the round started from, except in round 1, where every client
    trained the one common model and the centres are :func:`farthest_first` of the trained
    models (docs/choices.md)."""
    if state.round == 0:
        centres = farthest_first(replies.weights, len(state.models))
    else:
        centres = state.models
    return nearest_centres(centres, replies.weights)


def flat_updates(state, replies) -> np.ndarray:
    """``(replies, parameters)`` float64: each reply's trained weights minus the model it
    started from, every array flattened (what CFL compares)."""
    ids = replies.cluster_ids
    return np.concatenate([
        (stacked.reshape(len(ids), -1).astype(np.float64)
         - np.stack([state.models[c][i].reshape(-1) for c in ids]).astype(np.float64))
        for i, stacked in enumerate(replies.weights)], axis=1)


def bipartition(updates: np.ndarray) -> tuple[np.ndarray, float]:
    """CFL's split of one cluster: complete-linkage agglomerative clustering of the
    members' updates into two, by cosine similarity (the authors' code); 0/1 per member,
    and the largest cosine similarity between an update of one part and one of the other
    (Sattler et al.'s alpha_cross^max: low when the parts pull apart)."""
    from sklearn.cluster import AgglomerativeClustering

    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    unit = updates / np.where(norms > 0, norms, 1.0)
    similarity = unit @ unit.T
    halves = AgglomerativeClustering(n_clusters=2, metric="precomputed",
                                     linkage="complete").fit(-similarity).labels_
    return halves, float(similarity[np.ix_(halves == 0, halves == 1)].max())


def cfl_split(fl, state, replies) -> tuple[np.ndarray, object, dict]:
    """CFL's server step (Sattler et al., Algorithm 1) before aggregation: a cluster whose
    |D_u|-weighted mean update is below ``eps1`` while its largest update is above
    ``eps2`` (after ``split_after`` rounds, with at least ``min_split_size`` members) is
    split in two by :func:`bipartition` while a free pool slot is left, if the two parts'
    largest cross similarity is below ``max_cross`` (1: no such guard, as in the authors'
    code); the new cluster starts from its parent's model. Returns the replies' cluster
    ids, the pool, and the round record's ``split_test``: for every cluster that trained,
    the three numbers the test compares (how the thresholds were calibrated)."""
    options, ids = fl.options, replies.cluster_ids.copy()
    if len(ids) == 0:
        return ids, state, {}
    updates = flat_updates(state, replies)
    norms = np.linalg.norm(updates, axis=1)
    used = set(np.unique(state.assignment).tolist()) | set(ids.tolist())
    models = list(state.models)
    tests = {}
    for c in sorted(set(ids.tolist())):
        members = np.flatnonzero(ids == c)
        share = replies.sizes[members] / replies.sizes[members].sum()
        mean, top = float(np.linalg.norm(share @ updates[members])), float(norms[members].max())
        halves, cross = bipartition(updates[members]) if len(members) > 1 else (None, None)
        tests[str(c)] = {"mean_norm": mean, "max_norm": top, "cross_similarity": cross}
        free = [n for n in range(len(models)) if n not in used]
        if (state.round < options["split_after"] or not free
                or len(members) < options["min_split_size"]):
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


def fl_hc_split(fl, state, replies) -> tuple[np.ndarray, object]:
    """FL+HC's server step (Briggs et al. 2020): FedAvg until round ``cluster_round``
    (0-based), whose updates (from the one global model) are clustered once by
    :func:`hierarchical_clusters`; every cluster model starts from the global model.
    Clients not taking part in that round stay with cluster 0."""
    ids = replies.cluster_ids
    if state.round != fl.options["cluster_round"] or len(ids) == 0:
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


def sent_bytes(answers: Sequence[np.ndarray] | None) -> int:
    """The bytes of the arrays the clients sent as answers (0: none asked)."""
    return 0 if answers is None else int(sum(a.nbytes for a in answers))


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
            proximity[i, j] = proximity[j, i] = principal_angles(subspaces[i],
                                                                 subspaces[j]).sum()
    if min(num_clusters, count) < 2:
        return np.zeros(count, np.int64)
    return AgglomerativeClustering(n_clusters=min(num_clusters, count), metric="precomputed",
                                   linkage="average").fit(proximity).labels_.astype(np.int64)


def leading_directions(updates: np.ndarray, count: int) -> np.ndarray:
    """``(count, parameters)``: the leading right singular vectors of the updates (one per
    row), unit length, float64 (FedGroup's decomposition of the update matrix)."""
    directions = np.linalg.svd(updates, full_matrices=False)[2]
    return directions[:min(count, len(directions))]


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
