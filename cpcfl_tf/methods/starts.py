"""Where a federated run's encoder starts from (``federated.pretraining``): one object per
start, in :data:`START`.

A start says what it is (its label in tables, whether it gives a pre-trained encoder,
whether runs of one key share it, whether the Flower apps can begin from it), which
pre-training it needs (:meth:`Start.pretraining`: the :class:`Pretraining` a run's plan
carries, with the method's registry entry, its settings and seed, all the pre-training
stage is given) and how its encoder is got, the way a Flower strategy overrides a stage:
:meth:`Start.encoder`, :meth:`Start.status` and :meth:`Start.ready` take the run's plan
and ask the one cache of encoders
(:class:`cpcfl_tf.clustered.starting.StartingEncoders`, passed in) for the piece of work
that start needs: a random initialisation needs none, the server's pre-trainings and
the supervised one their cached folder, IFCA (FedAvg)'s encoder a FedAvg run, a
federated pre-training the clients' images. Nothing else compares a start's name.

This module imports nothing of the kit but its errors, the record layouts
(:mod:`cpcfl_tf.compat`), the aggregation settings (:mod:`cpcfl_tf.aggregation`) and the
self-supervised registry, so every layer may read it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from cpcfl_tf.aggregation import Defence
from cpcfl_tf.compat import stored_pretrain
from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.ssl import FEDERATED_STARTS, SSL_METHODS, FederatedSSL, SSLMethod


@dataclasses.dataclass(frozen=True)
class Pretraining:
    """The pre-training a run's start needs, all the pre-training stage is given: the
    server's self-supervised one (``ssl`` with its ``settings``), the supervised one
    (``ssl`` None, no settings), or a federated one (``federated`` with its own settings,
    of ``ssl``) on the clients of ``partition``."""

    name: str
    """The start's name (``federated.pretraining``): its cache folder's prefix."""
    ssl: SSLMethod | None
    """The self-supervised method (None: the supervised pre-training)."""
    settings: dict[str, Any]
    """Every setting of ``ssl`` with the value it runs with (empty: supervised)."""
    seed: int
    """The pre-training's seed (:attr:`~cpcfl_tf.plan.config.Config.pretrain_seed`)."""
    pretrain: Any
    """The run's ``pretrain`` section (:class:`~cpcfl_tf.plan.config.PretrainConfig`)."""
    data: Any
    """The run's ``data`` section (:class:`~cpcfl_tf.plan.config.DataConfig`)."""
    federated: FederatedSSL | None = None
    federated_settings: dict[str, Any] | None = None
    """The federated pre-training's settings, defaults filled in and ``rounds`` resolved
    (given, or the server's passes: :func:`federated_rounds`)."""
    partition: Any = None
    """A federated one's: the clients' ``partition`` section (their unlabeled deal)."""
    partition_seed: int | None = None
    """A federated one's: the seed of the clients' partition (``config.seed``)."""
    defence: Defence = Defence()
    """A federated one's: how a round combines its clients' uploads (the run's
    ``federated.aggregation``, ``trim_fraction`` and ``update_norm``: one setting for both
    stages)."""

    @property
    def method(self) -> str:
        """The method's name: the self-supervised one's, or "supervised"."""
        return self.ssl.name if self.ssl is not None else "supervised"


def sampled_count(num_clients: int, participation: float) -> int:
    """How many of ``num_clients`` clients a federated pre-training samples each round."""
    return max(1, int(math.ceil(participation * num_clients)))


def federated_rounds(settings: dict[str, Any], epochs: int) -> int:
    """A federated pre-training's rounds: ``settings``' own, or as many as give the
    server's ``epochs`` passes over the images (``local_epochs`` x ``participation`` per
    round)."""
    passes = settings["local_epochs"] * settings["participation"]
    return settings["rounds"] or max(1, round(epochs / passes))


@dataclasses.dataclass(frozen=True)
class Start:
    """Random initialisation, and what every start is."""

    name: str
    label: str
    pretrained: bool = False
    """It gives a pre-trained encoder (what CP-CFL needs:
    :data:`~cpcfl_tf.methods.federated.PRETRAINED`)."""
    shared: bool = False
    """Runs of one pre-training key start from one encoder (a run record's
    ``pretraining_key``); False: random weights, or each run's own FedAvg encoder."""
    on_flower: bool = True
    """The Flower ServerApp can begin from it."""
    ssl_method: str = ""
    """The self-supervised method it pre-trains with ("": none)."""
    federated: FederatedSSL | None = None
    """The federated pre-training that runs it on the clients' images (None: not one)."""

    @property
    def gives_encoder(self) -> bool:
        """It starts the run from an encoder (not from random weights)."""
        return type(self) is not Start

    def check(self, config) -> None:
        """Refuse, in one line naming the fix, a ``config`` this start cannot begin from
        (names only: what the data can hold is :func:`cpcfl_tf.plan.resolve.check_data`'s)."""

    def pretraining(self, config) -> Pretraining | None:
        """The pre-training this start needs for ``config`` (None: none)."""
        return None

    def federated_settings(self, config) -> dict[str, Any] | None:
        """Its federated pre-training's settings in ``config`` (its entry's in
        ``pretrain.options``, defaults filled in; ``rounds`` may still be None, the
        server's passes); None for a start that is not federated."""
        if self.federated is None:
            return None
        return self.federated.resolve((config.pretrain.options or {}).get(self.federated.name))

    def recorded_pretrain(self, config) -> dict[str, Any]:
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

    def encoder(self, source, run):
        """The starting encoder of ``run`` (its :class:`~cpcfl_tf.plan.resolve.RunPlan`)
        as weights (None: random), got from ``source`` for the plan's pretraining."""
        return None

    def status(self, source, run) -> str:
        """Where it would come from now (nothing is built)."""
        return "random initialisation"

    def ready(self, source, run) -> bool:
        """Whether it is at hand without training."""
        return True


@dataclasses.dataclass(frozen=True)
class ServerPretraining(Start):
    """The server's self-supervised pre-training with ``ssl_method`` on unlabeled images."""

    pretrained: bool = True
    shared: bool = True

    def check(self, config) -> None:
        where = config.partition.unlabeled
        if where != "server":
            raise UserError(
                f"with partition.unlabeled={where} the server holds no unlabeled "
                f"images to pre-train {self.name} on; start from "
                f"fed-{self.ssl_method or 'simclr'}, or set "
                "partition.unlabeled=server"
            )

    def pretraining(self, config) -> Pretraining | None:
        return Pretraining(
            self.name,
            SSL_METHODS[self.ssl_method],
            config.pretrain.settings(self.ssl_method),
            config.pretrain_seed,
            config.pretrain,
            config.data,
        )

    def encoder(self, source, run):
        return source.contrastive(run).encoder.get_weights()

    def fresh(self, source, run) -> str:
        return f"to pre-train ({run.pretraining.pretrain.epochs} epochs)"

    def status(self, source, run) -> str:
        return source.cache_status(
            run.pretraining, self.finished_file(source, run), self.fresh(source, run)
        )

    def ready(self, source, run) -> bool:
        return self.finished_file(source, run).exists()

    def finished_file(self, source, run):
        """The file a finished pre-training leaves in its cache folder."""
        return source.pretrain_folder(run.pretraining) / "pretrain.json"


@dataclasses.dataclass(frozen=True)
class Supervised(ServerPretraining):
    """The server's supervised pre-training on the labeled version of the same split."""

    def pretraining(self, config) -> Pretraining | None:
        return Pretraining(self.name, None, {}, config.pretrain_seed, config.pretrain, config.data)

    def encoder(self, source, run):
        return source.supervised(run)

    def finished_file(self, source, run):
        return source.pretrain_folder(run.pretraining) / "encoder.npz"


@dataclasses.dataclass(frozen=True)
class FederatedPretraining(ServerPretraining):
    """A federated self-supervised pre-training (``federated``) of ``ssl_method`` on the
    clients' unlabeled images."""

    def check(self, config) -> None:
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

    def pretraining(self, config) -> Pretraining | None:
        settings = self.federated_settings(config)
        settings = {**settings, "rounds": federated_rounds(settings, config.pretrain.epochs)}
        return Pretraining(
            self.name,
            SSL_METHODS[self.ssl_method],
            config.pretrain.settings(self.ssl_method),
            config.pretrain_seed,
            config.pretrain,
            config.data,
            self.federated,
            settings,
            config.partition,
            config.seed,
            Defence.of(config.federated),
        )

    def encoder(self, source, run):
        return source.federated(run).encoder.get_weights()

    def fresh(self, source, run) -> str:
        return f"to pre-train federated ({run.pretraining.federated_settings['rounds']} rounds)"

    def finished_file(self, source, run):
        return source.federated_folder(run.pretraining) / "pretrain.json"


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

    def encoder(self, source, run):
        return source.fedavg(run.requested)

    def status(self, source, run) -> str:
        if self.ready(source, run):
            return "FedAvg encoder: cached"
        return "FedAvg encoder: kept from the FedAvg (None) run (trained first if none)"

    def ready(self, source, run) -> bool:
        return source.fedavg_ready(run.requested)


START: dict[str, Start] = {
    s.name: s
    for s in (
        Start("none", "None"),
        *(ServerPretraining(m.name, m.label, ssl_method=m.name) for m in SSL_METHODS.values()),
        FedAvgEncoder("fedavg", "FedAvg"),
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
