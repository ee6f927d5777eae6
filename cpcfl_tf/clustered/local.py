"""How one client trains locally, whichever backend runs it.

:class:`LocalTraining` says how a client trains (optimizer, learning rate, batch size);
:class:`ClientMoments` is the Adam state clients keep between rounds when
``optimizer_state="client"`` (the zig-zag study, ``experiments/local_optimizer.py``).
Also the stacked weights of many models (:data:`Stacked`) and the seeded batch orders
that make a resumed run replay an uninterrupted one's batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

Stacked = list[np.ndarray]
"""Weights of many models, array by array, each with a leading model/client axis."""

B1, B2, EPS = 0.9, 0.999, 1e-7
"""Keras' Adam defaults (beta_1, beta_2, epsilon)."""

MODEL, HEAD, ENCODER = "model", "head", "encoder"
"""What one local epoch trains: the whole model; the head on the frozen encoder (the Tc
phase, the epochs after ``E_l,f``; FedRep's head epochs); the encoder under the fixed
head (FedRep's representation epochs). :func:`cpcfl_tf.clustered.algorithm.epoch_parts`
gives a round's."""


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """How a client trains its model: the paper's is Adam 1e-3, batch 32."""

    batch_size: int = 32
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    """adam | sgd."""
    frozen_features: bool = False
    """Train the head of an epoch that freezes the encoder on the encoder's features of
    the client's images computed once in the round, not in every step
    (``federated.frozen_features``)."""
    prox: float = 0.0
    """lambda of a proximal term ``lambda / 2 * ||w - anchor||^2`` added to the client's
    loss, which pulls what it trains towards the ``anchor`` model the backend is given
    (Ditto's personal model towards the round's global one); 0: none."""

    @classmethod
    def of(cls, fl) -> LocalTraining:
        """The local training a :class:`~cpcfl_tf.plan.sections.FederatedConfig` names."""
        return cls(fl.batch_size, fl.learning_rate, fl.local_optimizer, fl.frozen_features)


def trained_arrays(part: str, num_encoder: int) -> slice:
    """The arrays (``get_weights`` order) an epoch that trains ``part`` updates; the
    encoder's are the first ``num_encoder``."""
    if part not in (MODEL, HEAD, ENCODER):
        raise ValueError(f"an epoch trains {MODEL!r}, {HEAD!r} or {ENCODER!r}, not {part!r}")
    if part == HEAD:
        return slice(num_encoder, None)
    return slice(0, num_encoder) if part == ENCODER else slice(0, None)


@dataclasses.dataclass
class ClientMoments:
    """Adam's first and second moments of every client, array by array (leading client
    axis), and each client's step count: the optimizer state a client keeps between
    rounds when ``optimizer_state="client"``."""

    m: Stacked
    v: Stacked
    steps: np.ndarray

    @classmethod
    def zeros(cls, model: Sequence[np.ndarray], num_clients: int) -> ClientMoments:
        m = [np.zeros((num_clients, *a.shape), np.float32) for a in model]
        return cls(m, [a.copy() for a in m], np.zeros(num_clients, np.int64))

    def subset(self, clients: np.ndarray) -> ClientMoments:
        return ClientMoments(
            [a[clients] for a in self.m], [a[clients] for a in self.v], self.steps[clients]
        )

    def put(self, clients: np.ndarray, part: ClientMoments) -> None:
        """Write back the state of ``clients`` after they trained."""
        for full, new in zip(self.m + self.v, part.m + part.v):
            full[clients] = new
        self.steps[clients] = part.steps

    def arrays(self) -> dict[str, np.ndarray]:
        """Named arrays, for a checkpoint."""
        return {
            "steps": self.steps,
            **{f"m{i}": a for i, a in enumerate(self.m)},
            **{f"v{i}": a for i, a in enumerate(self.v)},
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> ClientMoments:
        count = sum(1 for k in arrays if k.startswith("m"))
        return cls(
            [arrays[f"m{i}"] for i in range(count)],
            [arrays[f"v{i}"] for i in range(count)],
            arrays["steps"],
        )


@dataclasses.dataclass
class ClientParts:
    """The part of the model every client keeps between rounds (a personalized method's:
    :attr:`~cpcfl_tf.methods.federated.Method.keeps`): arrays ``index`` of the model, each
    with a leading client axis, held for every client, taking part or not; never sent."""

    index: tuple[int, ...]
    """Which of the model's arrays (in ``get_weights`` order) are kept."""
    arrays: Stacked

    @classmethod
    def of(cls, model: Sequence[np.ndarray], index: Sequence[int], num_clients: int) -> ClientParts:
        """Every client's part as ``model``'s (the pool's first model: where each starts)."""
        return cls(tuple(index), [np.repeat(model[i][None], num_clients, axis=0) for i in index])

    def models(self, model: Sequence[np.ndarray], clients: np.ndarray) -> Stacked:
        """The models ``clients`` train from and are scored with, stacked: ``model``
        with each one's kept arrays in place of its own."""
        kept = dict(zip(self.index, self.arrays))
        return [
            kept[i][clients] if i in kept else np.repeat(a[None], len(clients), axis=0)
            for i, a in enumerate(model)
        ]

    def model(self, model: Sequence[np.ndarray], client: int) -> list[np.ndarray]:
        """Client ``client``'s model, ``model`` with its kept arrays: views, not copies."""
        kept = dict(zip(self.index, self.arrays))
        return [kept[i][client] if i in kept else a for i, a in enumerate(model)]

    def put(self, clients: np.ndarray, trained: Stacked) -> None:
        """Keep the trained part of ``clients`` (``trained``: their whole models, stacked)."""
        for full, i in zip(self.arrays, self.index):
            full[clients] = trained[i]

    @property
    def nbytes(self) -> int:
        """What the clients keep, all of them: bytes never sent."""
        return int(sum(a.nbytes for a in self.arrays))


def batch_orders(num_clients: int, size: int, epochs: int, seed_words: Sequence[int]) -> np.ndarray:
    """``(epochs, clients, size)`` shuffles of each client's examples, one per epoch.

    Drawn from a generator seeded by ``seed_words`` (run seed, round, ...) so a resumed
    run replays exactly the batches of an uninterrupted one.
    """
    rng = np.random.default_rng(list(seed_words))
    return np.stack(
        [np.stack([rng.permutation(size) for _ in range(num_clients)]) for _ in range(epochs)]
    ).astype(np.int32)


def stack_models(models: Sequence[list[np.ndarray]]) -> Stacked:
    return [np.stack(arrays) for arrays in zip(*models)]


def unstack(stacked: Stacked, index: int) -> list[np.ndarray]:
    return [a[index] for a in stacked]


def adam_alpha(learning_rate: float, step: int | np.ndarray) -> float | np.ndarray:
    """Adam's bias-corrected step size after ``step`` steps (one per client when kept)."""
    return learning_rate * np.sqrt(1 - B2**step) / (1 - B1**step)
