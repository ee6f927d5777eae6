"""Where a federated run's encoder starts from (``federated.pretraining``): one object per
start, in :data:`START`.

A start says what it is (its label in tables, whether it gives a pre-trained encoder,
whether runs of one key share it, whether the Flower apps can begin from it, the
self-supervised method and federated pre-training it runs: what
:func:`cpcfl_tf.plan.resolve.pretraining_of` puts in a run's plan) and how its encoder is
got, the way a Flower strategy overrides a stage: :meth:`Start.encoder`,
:meth:`Start.status` and :meth:`Start.ready` ask an :class:`EncoderSource` (the one cache
of encoders, :class:`cpcfl_tf.clustered.starting.StartingEncoders`, passed in) for the
piece of work that start needs for a run: a random initialisation needs none, the
server's pre-trainings and the supervised one their cached folder, IFCA (FedAvg)'s
encoder a FedAvg run, a federated pre-training the clients' images. Nothing else
compares a start's name.

This module imports nothing of the kit but its errors, the record layouts
(:mod:`cpcfl_tf.compat`) and the self-supervised registry, so every layer may read it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from cpcfl_tf.compat import stored_pretrain
from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.ssl import FEDERATED_STARTS, SSL_METHODS, FederatedSSL, SSLMethod

Weights = list[np.ndarray]
"""An encoder's weights, in Keras' ``get_weights`` order."""

Run = TypeVar("Run")
RunIn = TypeVar("RunIn", contravariant=True)


class WithEncoder(Protocol):
    """A finished pre-training as the source gives it: its encoder, with weights."""

    @property
    def encoder(self) -> Any:
        """The Keras encoder (this layer imports no Keras: its ``get_weights()`` is all a
        start reads)."""


class EncoderSource(Protocol[RunIn]):
    """What a start asks of the cache of starting encoders for a run (its plan,
    :class:`~cpcfl_tf.plan.resolve.RunPlan`): one piece of work per kind of start, and
    whether a pre-training's folder holds its finished file. The start never reads the run:
    it says which work, the source knows the run."""

    def contrastive(self, run: RunIn) -> WithEncoder:
        """The run's server self-supervised pre-training, cached."""
        ...

    def federated(self, run: RunIn) -> WithEncoder:
        """The run's federated self-supervised pre-training, cached."""
        ...

    def supervised(self, run: RunIn) -> Weights:
        """The run's supervised pre-training's encoder, cached."""
        ...

    def fedavg(self, run: RunIn) -> Weights:
        """The encoder of the FedAvg (None) run on the run's clients, cached."""
        ...

    def fedavg_ready(self, run: RunIn) -> bool:
        """Whether that FedAvg encoder is at hand."""
        ...

    def pretraining_status(self, run: RunIn, finished: str) -> str:
        """Where the run's pre-training would come from now: cached (its folder holds
        ``finished``), to resume, or to make."""
        ...

    def pretraining_done(self, run: RunIn, finished: str) -> bool:
        """Whether the run's pre-training's folder holds ``finished``."""
        ...


class PretrainSection(Protocol):
    """What a start reads of a run's ``pretrain`` section
    (:class:`~cpcfl_tf.plan.sections.PretrainConfig`)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def lr_schedule(self) -> str: ...

    def settings(self, method: str | SSLMethod) -> dict[str, Any]: ...

    @property
    def options(self) -> dict[str, dict[str, Any]] | None: ...


class PartitionSection(Protocol):
    """What a start reads of a run's ``partition`` section
    (:class:`~cpcfl_tf.plan.sections.PartitionConfig`)."""

    @property
    def unlabeled(self) -> str: ...


class StartConfig(Protocol):
    """What a start reads of a run's config (:class:`~cpcfl_tf.plan.config.Config`)."""

    @property
    def pretrain(self) -> PretrainSection: ...

    @property
    def partition(self) -> PartitionSection: ...


def sampled_count(num_clients: int, participation: float) -> int:
    """How many of ``num_clients`` clients a federated pre-training samples each round."""
    return max(1, int(math.ceil(participation * num_clients)))


@dataclasses.dataclass(frozen=True)
class Start:
    """Random initialisation, and what every start is."""

    name: str
    label: str
    pretrained: bool = False
    """It gives a pre-trained encoder (what CP-CFL needs:
    :data:`~cpcfl_tf.methods.federated.PRETRAINED`): a run's plan carries its
    pre-training (:func:`~cpcfl_tf.plan.resolve.pretraining_of`)."""
    shared: bool = False
    """Runs of one pre-training key start from one encoder (a run record's
    ``pretraining_key``); False: random weights, or each run's own FedAvg encoder."""
    on_flower: bool = True
    """The Flower ServerApp can begin from it."""
    ssl_method: str = ""
    """The self-supervised method it pre-trains with ("": none; pre-trained: supervised)."""
    federated: FederatedSSL | None = None
    """The federated pre-training that runs it on the clients' images (None: not one)."""

    @property
    def gives_encoder(self) -> bool:
        """It starts the run from an encoder (not from random weights)."""
        return type(self) is not Start

    @property
    def ssl(self) -> SSLMethod | None:
        """Its self-supervised method's registry entry (None: none, or supervised)."""
        return SSL_METHODS[self.ssl_method] if self.ssl_method else None

    def check(self, config: StartConfig) -> None:
        """Refuse, in one line naming the fix, a ``config`` this start cannot begin from
        (names only: what the data can hold is :func:`cpcfl_tf.plan.resolve.check_data`'s)."""

    def federated_settings(self, config: StartConfig) -> dict[str, Any] | None:
        """Its federated pre-training's settings in ``config`` (its entry's in
        ``pretrain.options``, defaults filled in; ``rounds`` may still be None, the
        server's passes); None for a start that is not federated."""
        if self.federated is None:
            return None
        return self.federated.resolve((config.pretrain.options or {}).get(self.federated.name))

    def recorded_pretrain(self, config: StartConfig) -> dict[str, Any]:
        """``config.pretrain`` as a run record writes it (:func:`cpcfl_tf.compat.stored_pretrain`'s
        layout): every setting of its self-supervised method named, and of its federated
        pre-training (none for a start without them)."""
        method = self.ssl_method or None
        stored = stored_pretrain(
            dataclasses.asdict(config.pretrain),
            method,
            config.pretrain.settings(method) if method else None,
        )
        if self.federated is not None:
            stored["options"] = {
                **(stored["options"] or {}),
                self.federated.name: self.federated_settings(config),
            }
        return stored

    def made_by(self, method: str, start: str) -> bool:
        """Whether a run of ``method`` from ``start`` ends with this start's encoder (then
        its final encoder is kept for the runs that begin from it)."""
        return False

    def encoder(self, source: EncoderSource[Run], run: Run) -> Weights | None:
        """The starting encoder of ``run`` as weights (None: random), got from
        ``source``."""
        return None

    def status(self, source: EncoderSource[Run], run: Run) -> str:
        """Where it would come from now (nothing is built)."""
        return "random initialisation"

    def ready(self, source: EncoderSource[Run], run: Run) -> bool:
        """Whether it is at hand without training."""
        return True


@dataclasses.dataclass(frozen=True)
class ServerPretraining(Start):
    """The server's self-supervised pre-training with ``ssl_method`` on unlabeled images."""

    pretrained: bool = True
    shared: bool = True
    finished: str = "pretrain.json"
    """The file a finished pre-training leaves in its cache folder."""

    def check(self, config: StartConfig) -> None:
        where = config.partition.unlabeled
        if where != "server":
            raise UserError(
                f"with partition.unlabeled={where} the server holds no unlabeled "
                f"images to pre-train {self.name} on; start from "
                f"fed-{self.ssl_method or 'simclr'}, or set "
                "partition.unlabeled=server"
            )

    def encoder(self, source: EncoderSource[Run], run: Run) -> Weights | None:
        return source.contrastive(run).encoder.get_weights()

    def status(self, source: EncoderSource[Run], run: Run) -> str:
        return source.pretraining_status(run, self.finished)

    def ready(self, source: EncoderSource[Run], run: Run) -> bool:
        return source.pretraining_done(run, self.finished)


@dataclasses.dataclass(frozen=True)
class Supervised(ServerPretraining):
    """The server's supervised pre-training on the labeled version of the same split."""

    finished: str = "encoder.npz"

    def encoder(self, source: EncoderSource[Run], run: Run) -> Weights | None:
        return source.supervised(run)


@dataclasses.dataclass(frozen=True)
class FederatedPretraining(ServerPretraining):
    """A federated self-supervised pre-training (``federated``) of ``ssl_method`` on the
    clients' unlabeled images."""

    def check(self, config: StartConfig) -> None:
        if config.partition.unlabeled == "server":
            raise UserError(
                f"{self.name} pre-trains on the clients' unlabeled images; set "
                "partition.unlabeled=iid or groups"
            )
        if config.pretrain.lr_schedule != "constant":
            raise UserError(
                f"{self.name} runs a constant learning rate (a fresh Adam per "
                "client round); set pretrain.lr_schedule=constant"
            )
        if (
            config.pretrain.settings(self.ssl_method).get("target_schedule", "constant")
            != "constant"
        ):
            raise UserError(
                f"{self.name} keeps BYOL's target on the client with a constant "
                f"rate; drop {self.ssl_method}.target_schedule from pretrain.options"
            )

    def encoder(self, source: EncoderSource[Run], run: Run) -> Weights | None:
        return source.federated(run).encoder.get_weights()


@dataclasses.dataclass(frozen=True)
class FedAvgEncoder(Start):
    """IFCA (FedAvg)'s start: the global encoder of a FedAvg (None) run on the same
    clients (a federation of its own: not on Flower)."""

    on_flower: bool = False
    run: tuple[str, str] = ("fedavg", "none")
    """(method, start) of the run whose final global encoder this start is (FedAvg
    (None): tab:different_methods)."""

    def made_by(self, method: str, start: str) -> bool:
        return (method, start) == self.run

    def encoder(self, source: EncoderSource[Run], run: Run) -> Weights | None:
        return source.fedavg(run)

    def status(self, source: EncoderSource[Run], run: Run) -> str:
        if self.ready(source, run):
            return "FedAvg encoder: cached"
        return "FedAvg encoder: kept from the FedAvg (None) run (trained first if none)"

    def ready(self, source: EncoderSource[Run], run: Run) -> bool:
        return source.fedavg_ready(run)


FEDAVG_ENCODER = FedAvgEncoder("fedavg", "FedAvg")
"""IFCA (FedAvg)'s start."""

START: dict[str, Start] = {
    s.name: s
    for s in (
        Start("none", "None"),
        *(ServerPretraining(m.name, m.label, ssl_method=m.name) for m in SSL_METHODS.values()),
        FEDAVG_ENCODER,
        Supervised("supervised", "Supervised"),
        *(
            FederatedPretraining(name, fed.start_label(method), ssl_method=method, federated=fed)
            for name, (fed, method) in FEDERATED_STARTS.items()
        ),
    )
}
"""Every start, by ``federated.pretraining``: random weights, the server's
self-supervised pre-trainings (one per registry entry), IFCA (FedAvg)'s encoder, the
supervised pre-training, the federated self-supervised pre-trainings."""
