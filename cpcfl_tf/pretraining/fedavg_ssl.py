"""FedAvg of a self-supervised model (FedU's and FedEMA's baseline: FedSimCLR, FedBYOL,
FedSimSiam, FedVICReg), as small stages over an explicit state.

A round (:func:`cpcfl_tf.pretraining.federated_pretrain.federated_pretrain` runs it):

1. every sampled client sets its model from the global online parts
   (:meth:`FedAvgSSL.local_start`), a moving-average target network from its own kept
   copy (on its first round: the global online parts, as BYOL starts its target);
2. it runs E_p local epochs of the method's own training step on its unlabeled images;
3. it keeps what stays on the client (:meth:`FedAvgSSL.local_end`: BYOL's target) and
   sends its online parts and its image count;
4. the server averages the online parts by image count (:meth:`FedAvgSSL.average`).

What travels: the online encoder, projector and predictor (EasyFL fedssl's FedBYOL:
``--aggregate_encoder online --update_encoder online --update_predictor global``); BYOL's
target never leaves the client (docs/choices.md). A variant overrides a stage
(:mod:`cpcfl_tf.pretraining.fedema`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cpcfl_tf.pretraining.model import ContrastiveModel

Weights = list[np.ndarray]


@dataclasses.dataclass
class ClientState:
    """What one client keeps between its rounds (never sent), each stage's own by name:
    weight lists (BYOL's ``target``; FedEMA's ``previous``) and numbers (FedEMA's
    ``scaler``)."""

    weights: dict[str, Weights] = dataclasses.field(default_factory=dict)
    numbers: dict[str, float] = dataclasses.field(default_factory=dict)

    def arrays(self) -> dict[str, np.ndarray]:
        """For a checkpoint: array i of weight list ``name`` as ``name.i``, a number as
        ``name``."""
        out = {}
        for name, weights in self.weights.items():
            for i, a in enumerate(weights):
                out[f"{name}.{i}"] = a
        out.update({name: np.array(value) for name, value in self.numbers.items()})
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> ClientState:
        lists: dict[str, dict[int, np.ndarray]] = {}
        numbers = {}
        for key, value in arrays.items():
            name, dot, index = key.partition(".")
            if dot:
                lists.setdefault(name, {})[int(index)] = value
            else:
                numbers[name] = float(value)
        return cls(
            {name: [items[i] for i in sorted(items)] for name, items in lists.items()}, numbers
        )


def get_parts(parts) -> Weights:
    """The weights of ``parts`` (Keras models), one list in order."""
    return [w for part in parts for w in part.get_weights()]


def set_parts(parts, weights: Weights) -> None:
    """Set ``parts`` from one list (:func:`get_parts`'s order)."""
    i = 0
    for part in parts:
        n = len(part.weights)
        part.set_weights(weights[i : i + n])
        i += n
    assert i == len(weights), (i, len(weights))


def trainable_mask(parts) -> list[bool]:
    """Which of :func:`get_parts`' arrays are trainable (not BatchNormalization's
    moving statistics)."""
    mask: list[bool] = []
    for part in parts:
        trainable = {id(v) for v in part.trainable_weights}
        mask.extend(id(v) in trainable for v in part.weights)
    return mask


class FedAvgSSL:
    """FedAvg of the method's online parts; BYOL's target kept on the client."""

    reported: tuple[str, ...] = ()
    """What :meth:`local_start` returns that a round's record gains, as its mean over the
    round's clients (FedEMA's ``mu``)."""

    def __init__(self, settings: dict):
        self.settings = settings

    @staticmethod
    def shared(model: ContrastiveModel) -> list:
        """The sub-models that travel (sent down, trained, sent up, averaged)."""
        return model.online_parts

    def local_start(
        self, model: ContrastiveModel, global_weights: Weights, state: ClientState
    ) -> dict:
        """Set the client's model for its round; returns what the round's record gains."""
        set_parts(self.shared(model), global_weights)
        pairs = model.target_pairs()
        if pairs:
            targets = [t for t, _ in pairs]
            set_parts(targets, state.weights.get("target") or get_parts([o for _, o in pairs]))
        return {}

    def local_end(self, model: ContrastiveModel, state: ClientState) -> Weights:
        """Keep what stays on the client; return what it sends (its online parts)."""
        pairs = model.target_pairs()
        if pairs:
            state.weights["target"] = get_parts([t for t, _ in pairs])
        return get_parts(self.shared(model))

    @staticmethod
    def average(uploads: list[Weights], counts: list[int]) -> Weights:
        """The average of ``uploads`` weighted by the clients' image counts."""
        share = np.asarray(counts, dtype=np.float64) / float(sum(counts))
        return [
            sum(s * u[i].astype(np.float64) for s, u in zip(share, uploads)).astype(
                uploads[0][i].dtype
            )
            for i in range(len(uploads[0]))
        ]


def build(settings: dict) -> FedAvgSSL:
    return FedAvgSSL(settings)
