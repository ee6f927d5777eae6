"""How a clustered-FL method puts its clients in clusters: one object per rule.

A :class:`Rule` says, in one place, everything a rule does besides the round itself
(:mod:`cpcfl_tf.clustered.algorithm`):

- ``num_models``: how many models the pool holds (N);
- ``asks``, ``question``, ``answer``: what the server asks each client once before
  training, with which settings, and how the client answers from its own training data
  (PACFL's data subspace, the oracle's true group); ``answer_like``, ``answer_problem``:
  what a usable answer is (its shape and dtype; its values), which a federation's server
  checks every node's answer against;
- ``answer_bytes``: what those answers add to the bytes sent up (``bytes_other``);
- ``first``: each client's first model when the server assigns, from the answers;
- ``step``: the server's step after a round's replies, before aggregation: the cluster of
  each reply, the pool it aggregates into, and what the round's record gains;
- ``server_assigns``, ``communicates``: whether the server tells each client its model
  (then sends it that one model) and whether anything is sent at all.

:data:`RULES` names them; a method (:mod:`cpcfl_tf.methods.federated`) names its rule in
``Method.assign``. The algorithm, the simulator and both Flower apps call the rule and
never compare its name. Pure NumPy (and scikit-learn's clustering): the server state and
replies are read by their fields (``round``, ``models``, ``assignment``, ``memory``, the
rule's own arrays kept between rounds; ``clients``, ``cluster_ids``, ``sizes``,
``weights``), so this module imports nothing of the kit but its errors, the plugin
loader and the computations the rules are made of (:mod:`cpcfl_tf.methods.clustering`),
and sits below the config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.clustering import (
    Answers,
    PoolState,
    RoundReplies,
    RuleSettings,
    State,
    assigned,
    cfl_split,
    data_subspace,
    decomposed_cosines,
    fesem_step,
    fl_hc_split,
    flat_updates,
    kmeans_pp,
    leading_directions,
    mean_embedding,
    sent_bytes,
    subspace_clusters,
)
from cpcfl_tf.plugins import entries

ORTHONORMAL_TOLERANCE = 1e-4
"""The most an honest PACFL basis's Gram matrix differs from the identity, element by
element: float64 singular vectors rounded to float32 are off by about 1e-7 per element
(measured at 3,072 pixels in tests/test_families.py); 1e-4 leaves room for another BLAS,
and an all-zero or rescaled basis is off by 1 or more."""


class Rule:
    """The rule every method whose clients choose by their loss follows (IFCA's family):
    nothing is asked first, each client picks the pool model of lowest training loss
    (random picks in the Tc phase), the server averages by the choices."""

    name = "loss"
    description = (
        "each client picks the pool model with the lowest loss on its own "
        "training data (Eq. cluster_identity); random picks in the Tc phase"
    )
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
    groups_are_models = False
    """Its models are the clients' true groups (N = ``partition.num_groups``): a
    federation of nodes with their own data keeps the run config's groups for it."""
    server_assigns = False
    communicates = True

    def num_models(self, num_clusters: int, num_clients: int, num_groups: int) -> int:
        """N of a run with ``federated.num_clusters`` = ``num_clusters``."""
        return num_clusters

    def question(self, fl: RuleSettings) -> dict:
        """The settings the server sends with its question (e.g. PACFL's ``basis``)."""
        return {}

    def answer(self, question: dict, images: np.ndarray, group: int | None) -> np.ndarray:
        """A client's answer to :attr:`asks` from its training ``images`` (uint8) and, where
        it knows it, its true ``group``."""
        raise ValueError(f"rule {self.name!r} asks the clients nothing")

    def answer_like(self, question: dict, image_shape: tuple[int, ...]) -> np.ndarray:
        """An answer of the shape and dtype every client's answer to :attr:`asks` has, for
        training images of ``image_shape``: what a federation's server checks each
        node's answer against (:func:`cpcfl_tf.flower.checks.answered`)."""
        raise ValueError(f"rule {self.name!r} asks the clients nothing")

    def answer_problem(self, fl: RuleSettings, answer: np.ndarray, num_groups: int) -> str | None:
        """What is wrong with a client's (finite, well-shaped) answer beyond its shape and
        dtype, in a few words (None: nothing)."""
        return None

    def answer_bytes(self, answers: Answers | None) -> int:
        """Bytes the answers add to what the clients send up (``bytes_other``)."""
        return 0

    def first(
        self, fl: RuleSettings, num_clients: int, answers: Sequence[np.ndarray] | None
    ) -> np.ndarray | None:
        """Each client's first model when the server assigns (None: each chooses)."""
        return None

    def step(
        self, fl: RuleSettings, state: State, replies: RoundReplies
    ) -> tuple[np.ndarray, State, dict]:
        """The cluster of each reply the server aggregates by, the pool it aggregates into
        (``state``, possibly changed), and what the round's record gains."""
        return replies.cluster_ids, state, {}

    def remember(self, fl: RuleSettings, answers: Answers | None) -> dict[str, np.ndarray]:
        """What the server keeps from the answers for later rounds (``state.memory``)."""
        return {}

    def assignment(self, fl: RuleSettings, t: int, state: PoolState) -> np.ndarray | None:
        """Each client's model in round ``t`` (0-based) when the server gives it, else
        ``None`` (each chooses: at random in the Tc phase, then by loss)."""
        return state.assignment


class Own(Rule):
    name = "own"
    description = "each client keeps a model of its own; nothing is sent"
    server_assigns, communicates = True, False

    def num_models(self, num_clusters: int, num_clients: int, num_groups: int) -> int:
        return num_clients

    def first(
        self, fl: RuleSettings, num_clients: int, answers: Sequence[np.ndarray] | None
    ) -> np.ndarray | None:
        return np.arange(num_clients)


class TrueGroups(Rule):
    name = "groups"
    description = (
        "the server puts each client in its true group (which only this reference method is told)"
    )
    asks, server_assigns = "group", True
    node_needs = " with group=G in its node config"
    groups_are_models = True

    def num_models(self, num_clusters: int, num_clients: int, num_groups: int) -> int:
        return num_groups

    def answer(self, question: dict, images: np.ndarray, group: int | None) -> np.ndarray:
        if group is None:
            raise UserError(
                "the method needs this client's true group: add group=G to the node config"
            )
        return np.array([group], np.int64)

    def answer_like(self, question: dict, image_shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(1, np.int64)

    def answer_problem(self, fl: RuleSettings, answer: np.ndarray, num_groups: int) -> str | None:
        group = int(answer[0])
        return (
            None
            if 0 <= group < num_groups
            else f"group {group} is outside the run's 0..{num_groups - 1}"
        )

    def first(
        self, fl: RuleSettings, num_clients: int, answers: Sequence[np.ndarray] | None
    ) -> np.ndarray | None:
        if answers is None:
            raise ValueError("the oracle needs every client's true group")
        groups = np.array([int(a[0]) for a in answers])
        return np.unique(groups, return_inverse=True)[1].reshape(-1)


class OneFirst(Rule):
    """Rules whose first round trains one common model (pool model 0)."""

    server_assigns = True

    def first(
        self, fl: RuleSettings, num_clients: int, answers: Sequence[np.ndarray] | None
    ) -> np.ndarray | None:
        return np.zeros(num_clients, np.int64)


class Nearest(OneFirst):
    name = "nearest"
    description = (
        "the server puts each client's trained model in the cluster of the "
        "nearest centre (squared L2 distance), and each centre becomes its "
        "members' average"
    )

    def step(
        self, fl: RuleSettings, state: State, replies: RoundReplies
    ) -> tuple[np.ndarray, State, dict]:
        if not len(replies.clients):
            return replies.cluster_ids, state, {}
        return fesem_step(state, replies), state, {}


class Split(OneFirst):
    name = "split"
    description = (
        "all clients start in one cluster; the server splits a cluster in two by "
        "the cosine similarity of its members' updates once their mean is small "
        "and the largest one large"
    )

    def step(
        self, fl: RuleSettings, state: State, replies: RoundReplies
    ) -> tuple[np.ndarray, State, dict]:
        return cfl_split(fl, state, replies)


class Hierarchical(OneFirst):
    name = "hierarchical"
    description = (
        "FedAvg until a set round, whose updates the server clusters once "
        "(agglomerative, Ward's linkage); FedAvg within each cluster after it"
    )

    def step(
        self, fl: RuleSettings, state: State, replies: RoundReplies
    ) -> tuple[np.ndarray, State, dict]:
        return (*fl_hc_split(fl, state, replies), {})


class Subspaces(Rule):
    name = "subspaces"
    description = (
        "before training each client sends the leading singular vectors of its "
        "data; the server clusters the clients once by the principal angles "
        "between them; FedAvg within each cluster"
    )
    asks, server_assigns = "subspace", True

    def question(self, fl: RuleSettings) -> dict:
        return {"basis": int((fl.options or {})["basis"])}

    def answer(self, question: dict, images: np.ndarray, group: int | None) -> np.ndarray:
        return data_subspace(images, int(question["basis"]))

    def answer_like(self, question: dict, image_shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros((int(np.prod(image_shape)), int(question["basis"])), np.float32)

    def answer_problem(self, fl: RuleSettings, answer: np.ndarray, num_groups: int) -> str | None:
        """A data subspace is an orthonormal basis (the left singular vectors): its Gram
        matrix is the identity within float32 rounding (:data:`ORTHONORMAL_TOLERANCE`). An
        all-zero or scaled "basis" would sit at any angle its sender liked."""
        gram = answer.astype(np.float64).T @ answer.astype(np.float64)
        off = float(np.abs(gram - np.eye(len(gram))).max()) if gram.size else 0.0
        return (
            None
            if off <= ORTHONORMAL_TOLERANCE
            else f"the basis is not orthonormal (its Gram matrix is {off:.3g} away from the "
            f"identity, more than {ORTHONORMAL_TOLERANCE:g})"
        )

    def answer_bytes(self, answers: Answers | None) -> int:
        return sent_bytes(answers)

    def first(
        self, fl: RuleSettings, num_clients: int, answers: Sequence[np.ndarray] | None
    ) -> np.ndarray | None:
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
    description = (
        "CP-CFL's choice by loss, but the first choice after the Tc phase is the "
        "server's: k-means over the clients' mean embeddings by the frozen "
        "encoder, sent once before training"
    )
    asks, reads, on_flower = "features", "embeddings", False

    def answer(self, question: dict, embeddings: np.ndarray, group: int | None) -> np.ndarray:
        return mean_embedding(embeddings)

    def answer_bytes(self, answers: Answers | None) -> int:
        return sent_bytes(answers)

    def remember(self, fl: RuleSettings, answers: Answers | None) -> dict[str, np.ndarray]:
        given = [a for a in answers or () if a is not None]
        if answers is None or len(given) < len(answers):
            raise ValueError("the features rule needs every client's mean embedding")
        return {"feature_groups": kmeans_pp(np.stack(given).astype(np.float64), fl.num_clusters)[0]}

    def assignment(self, fl: RuleSettings, t: int, state: PoolState) -> np.ndarray | None:
        return state.memory["feature_groups"] if t == fl.head_rounds else state.assignment


class Decomposed(OneFirst):
    """FedGroup's rule (Duan et al. 2021, Sec. 4): a cold start, then static groups."""

    name = "decomposed"
    description = (
        "at the cold start (round 1, one common model) the server clusters the "
        "clients' updates by the Euclidean distance of their decomposed cosine "
        "similarity (cosines with the updates' leading singular directions), "
        "k-means++ into N groups; each client stays in its group, FedAvg within "
        "it; a client first seen later joins the group whose centre is nearest"
    )

    def step(
        self, fl: RuleSettings, state: State, replies: RoundReplies
    ) -> tuple[np.ndarray, State, dict]:
        ids = replies.cluster_ids.copy()
        if not len(ids):
            return ids, state, {}
        updates = flat_updates(state, replies)
        memory = state.memory
        if "directions" not in memory:  # the cold start
            directions = leading_directions(updates, fl.num_clusters)
            coords = decomposed_cosines(updates, directions)
            groups, centres = kmeans_pp(coords, fl.num_clusters)
            grouped = np.zeros(len(assigned(state)), dtype=bool)
            grouped[replies.clients] = True
            return (
                groups,
                dataclasses.replace(
                    state, memory={"directions": directions, "centres": centres, "grouped": grouped}
                ),
                {},
            )
        new = ~memory["grouped"][replies.clients]
        if new.any():  # newcomers join the nearest group centre
            coords = decomposed_cosines(updates[new], memory["directions"])
            distance = np.square(coords[:, None, :] - memory["centres"][None]).sum(-1)
            ids[new] = np.argmin(distance, axis=1)
            grouped = memory["grouped"].copy()
            grouped[replies.clients] = True
            state = dataclasses.replace(state, memory={**memory, "grouped": grouped})
        return ids, state, {}


RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule(),
        Own(),
        TrueGroups(),
        Nearest(),
        Split(),
        Hierarchical(),
        Subspaces(),
        Decomposed(),
        FeatureGroups(),
    )
}
RULES.update(entries("cpcfl_tf.rules", Rule, RULES))
"""Every rule, by the name a method's ``assign`` gives: the kit's, then the installed
plugins' (:mod:`cpcfl_tf.plugins`)."""
