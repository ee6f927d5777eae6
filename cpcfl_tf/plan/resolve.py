"""A run's plan: its :class:`~cpcfl_tf.plan.config.Config` resolved, once.

A ``Config`` is the request. Building it checks each value on its own and the names
between sections; it reads no folder and calls no tfds builder. :func:`resolve` turns it
into a :class:`RunPlan`, once per run:

* it checks what needs the data: the splits exist, the clients' splits hold labels,
  the three sets are disjoint, there are images enough for the clients and for the
  unlabeled deal (:func:`check_data`). These are one-line errors, raised before anything
  is written;
* it resolves the method as it runs: its rule, its start, N, Tc and the method's
  options, and the pre-training the start needs.

The algorithm, the simulator, the centralized baselines, both Flower apps and the runner
take the plan and never resolve again. A run record keeps ``plan.config`` (resolved) and
``plan.requested``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from cpcfl_tf.aggregation import Defence
from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.federated import METHODS, Method
from cpcfl_tf.methods.rules import Rule
from cpcfl_tf.methods.ssl import FederatedSSL, SSLMethod
from cpcfl_tf.methods.starts import START, Start, sampled_count
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.sections import DataConfig, FederatedConfig, PartitionConfig, PretrainConfig


@dataclasses.dataclass(frozen=True, eq=False)
class ResolvedFederated(FederatedConfig):
    """``federated`` as its method runs it (:func:`resolve`): the number of models
    N, Tc and the method's options as the run uses them. The algorithm and its drivers
    take the run's :class:`RunPlan`, whose config holds only this form (a requested
    config would run, say, FedAvg with three models or IFCA with a Tc phase). Equal to a
    :class:`FederatedConfig` of the same values (a run record's config reads back as
    this type)."""

    encoder: str = "cnn"
    """The encoder every client model builds: the request's ``pretrain.encoder``."""

    def __eq__(self, other):
        if isinstance(other, ResolvedFederated):
            return dataclasses.astuple(self) == dataclasses.astuple(other)
        if not isinstance(other, FederatedConfig):
            return NotImplemented
        return all(
            getattr(self, f.name) == getattr(other, f.name)
            for f in dataclasses.fields(FederatedConfig)
        )

    def __hash__(self):
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True))


def as_resolved(fl: FederatedConfig, encoder: str) -> ResolvedFederated:
    """``fl`` as the resolved type building ``encoder`` (the config's
    ``pretrain.encoder``), for a config already resolved when it was stored (a run
    record's ``config``); a requested one is resolved by :func:`resolve`."""
    return (
        fl
        if isinstance(fl, ResolvedFederated)
        else ResolvedFederated(
            **{f.name: getattr(fl, f.name) for f in dataclasses.fields(fl)}, encoder=encoder
        )
    )


def as_stored(config: Config) -> Config:
    """``config`` as a run record stored it: a federated run's as the run resolved it
    (its ``federated`` the resolved type), a centralized baseline's as requested (it has
    no N or Tc to resolve)."""
    if not METHODS[config.federated.method].federated:
        return config
    return dataclasses.replace(
        config, federated=as_resolved(config.federated, config.pretrain.encoder)
    )


def federated_settings(config: Config) -> dict[str, Any] | None:
    """The settings of the federated pre-training ``config`` starts from (its entry's in
    ``pretrain.options``, defaults filled in; ``rounds`` may still be None, the server's
    passes); None for a start that is not federated."""
    return START[config.federated.pretraining].federated_settings(config)


@dataclasses.dataclass(frozen=True)
class OnClients:
    """A federated pre-training's part of its plan: the method that runs it on the
    clients, its settings, the clients and how their uploads are combined."""

    method: FederatedSSL
    """The federated pre-training's registry entry (:data:`~cpcfl_tf.methods.ssl.FEDERATED_SSL`)."""
    settings: dict[str, Any]
    """Its settings, defaults filled in and ``rounds`` resolved (given, or the server's
    passes: :func:`federated_rounds`)."""
    partition: PartitionConfig
    """The clients' ``partition`` section (their unlabeled deal)."""
    partition_seed: int
    """The seed of the clients' partition (``config.seed``)."""
    defence: Defence = Defence()
    """How a round combines its clients' uploads (the run's ``federated.aggregation``,
    ``trim_fraction`` and ``update_norm``: one setting for both stages)."""


@dataclasses.dataclass(frozen=True)
class Pretraining:
    """The pre-training a run's start needs, all the pre-training stage is given: the
    server's self-supervised one (``ssl`` with its ``settings``), the supervised one
    (``ssl`` None, no settings), or a federated one of ``ssl`` on the clients
    (``federated``)."""

    name: str
    """The start's name (``federated.pretraining``): its cache folder's prefix."""
    ssl: SSLMethod | None
    """The self-supervised method (None: the supervised pre-training)."""
    settings: dict[str, Any]
    """Every setting of ``ssl`` with the value it runs with (empty: supervised)."""
    seed: int
    """The pre-training's seed (:attr:`~cpcfl_tf.plan.config.Config.pretrain_seed`)."""
    pretrain: PretrainConfig
    """The run's ``pretrain`` section."""
    data: DataConfig
    """The run's ``data`` section."""
    federated: OnClients | None = None
    """A federated one's run on the clients (None: the server's)."""

    @property
    def method(self) -> str:
        """The method's name: the self-supervised one's, or "supervised"."""
        return self.ssl.name if self.ssl is not None else "supervised"

    @property
    def fresh(self) -> str:
        """What making it would take, as a status line says it."""
        if self.federated is not None:
            return f"to pre-train federated ({self.federated.settings['rounds']} rounds)"
        return f"to pre-train ({self.pretrain.epochs} epochs)"


def federated_rounds(settings: dict[str, Any], epochs: int) -> int:
    """A federated pre-training's rounds: ``settings``' own, or as many as give the
    server's ``epochs`` passes over the images (``local_epochs`` x ``participation`` per
    round)."""
    passes = settings["local_epochs"] * settings["participation"]
    return settings["rounds"] or max(1, round(epochs / passes))


def pretraining_of(config: Config) -> Pretraining | None:
    """The pre-training ``config``'s start needs (None: none), as :func:`resolve` puts it
    in the plan (its data unchecked; also for a script that runs a pre-training alone):
    the start's self-supervised method with its settings, and its federated pre-training
    on the clients with theirs."""
    start = START[config.federated.pretraining]
    if not start.pretrained:
        return None
    ssl = start.ssl
    pretraining = Pretraining(
        start.name,
        ssl,
        config.pretrain.settings(ssl) if ssl is not None else {},
        config.pretrain_seed,
        config.pretrain,
        config.data,
    )
    settings = start.federated_settings(config)
    if start.federated is None or settings is None:
        return pretraining
    on_clients = OnClients(
        start.federated,
        {**settings, "rounds": federated_rounds(settings, config.pretrain.epochs)},
        config.partition,
        config.seed,
        Defence.of(config.federated),
    )
    return dataclasses.replace(pretraining, federated=on_clients)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What one run runs (:func:`resolve`)."""

    config: Config
    """The config as the method runs it: ``config.federated`` is the
    :class:`ResolvedFederated` (N, Tc and options as used)."""
    requested: Config
    """The config as it was asked for."""
    method: Method
    start: Start
    pretraining: Pretraining | None
    """None: the start pre-trains nothing (random weights, IFCA (FedAvg)'s encoder)."""
    gives: Start | None = None
    """The start whose encoder this run's final encoder is (FedAvg (None)'s run gives IFCA
    (FedAvg)'s start: :meth:`~cpcfl_tf.methods.starts.Start.made_by`); None: none."""

    @property
    def federated(self) -> ResolvedFederated:
        fl = self.config.federated
        assert isinstance(fl, ResolvedFederated)  # resolve() puts the resolved type here
        return fl

    @property
    def rule(self) -> Rule:
        return self.method.rule

    @property
    def num_models(self) -> int:
        """N."""
        return self.config.federated.num_clusters

    @property
    def head_rounds(self) -> int:
        """Tc."""
        return self.config.federated.head_rounds

    @property
    def options(self) -> dict[str, float] | None:
        """The method's options with the values used (None: it has none)."""
        return self.config.federated.options


def resolve(config: Config, *, checked: bool = False) -> RunPlan:
    """``config``'s plan. A config read back from a record is resolved already (its
    ``federated`` is the resolved type) and is its own request. ``checked``: its data was
    checked already (:func:`check_data` of a config of the same :func:`data_key`), so it
    is not checked again."""
    if not checked:
        check_data(config)
    fl, p = config.federated, config.partition
    method = METHODS[fl.method]
    if isinstance(fl, ResolvedFederated):
        resolved = config
    else:
        resolved = dataclasses.replace(
            config,
            federated=as_resolved(
                dataclasses.replace(
                    fl,
                    num_clusters=method.num_models(fl.num_clusters, p.num_clients, p.num_groups),
                    head_rounds=method.head_rounds(fl.pretraining, fl.head_rounds),
                    options=method.resolve_options(fl.options),
                ),
                config.pretrain.encoder,
            ),
        )
    method.check_settings(resolved.federated)
    start = START[fl.pretraining]
    gives = next((s for s in START.values() if s.made_by(fl.method, fl.pretraining)), None)
    pretraining = pretraining_of(config)
    check_defence(resolved, method, pretraining)
    return RunPlan(resolved, config, method, start, pretraining, gives)


def check_defence(config: Config, method: Method, pretraining: Pretraining | None) -> None:
    """Refuse, in one line, a robust aggregation that cannot hold at the sizes this run's
    combinations can have (:func:`cpcfl_tf.aggregation.defence_problem`): a clustered round
    where N >= 2 models are chosen (a cluster can have one member) or fewer than 3 clients
    take part, a federated pre-training round that samples fewer than 3 clients."""
    from cpcfl_tf.aggregation import defence_problem

    fl, clients = config.federated, config.partition.num_clients
    defence = Defence.of(fl)
    if method.federated and method.communicates:
        taking = fl.participants(clients)
        problem = (
            defence_problem(
                defence, 1, f"with N = {fl.num_clusters} models a cluster can have a single member"
            )
            if fl.num_clusters >= 2
            else defence_problem(
                defence,
                taking,
                f"a round has only {taking} participant{'s' if taking != 1 else ''}",
            )
        )
        if problem:
            raise UserError(problem)
    if pretraining is not None and pretraining.federated is not None:
        sampled = sampled_count(clients, pretraining.federated.settings["participation"])
        problem = defence_problem(
            defence,
            sampled,
            f"a round of {pretraining.name} averages the {sampled} clients it samples",
        )
        if problem:
            raise UserError(problem)


def data_key(config: Config) -> str:
    """What :func:`check_data` reads of ``config``: its data, partition and pre-training
    sections and its start (the unlabeled deal's check). Two configs of one key hold the
    same data, or fail the same way."""
    return repr((config.data, config.partition, config.pretrain, config.federated.pretraining))


def check_data(config: Config) -> None:
    """Refuse, in one line, a config its data cannot hold: every check that reads a
    dataset's facts (a folder's contents, a tfds builder's split sizes). Arithmetic only:
    no image is read."""
    from cpcfl_tf.data.partition import check_split_sizes, make_group_classes
    from cpcfl_tf.data.sources import get_spec, parse_split, split_size

    d, p = config.data, config.partition
    parse_split(d.pretrain_dataset, d.pretrain_split)
    spec = get_spec(d.client_dataset)
    for split in (d.client_train_split, d.client_test_split):
        base = parse_split(d.client_dataset, split).base
        if base in spec.unlabeled_splits:
            raise UserError(
                f"client data must be labeled, but {d.client_dataset}:{base} has no labels"
            )
    # The server's images, the clients' training and test images: three disjoint sets.
    named = [
        ("data.pretrain_split", d.pretrain_dataset, d.pretrain_split),
        ("data.client_train_split", d.client_dataset, d.client_train_split),
        ("data.client_test_split", d.client_dataset, d.client_test_split),
    ]
    for (a, a_set, a_split), (b, b_set, b_split) in (
        (named[0], named[1]),
        (named[0], named[2]),
        (named[1], named[2]),
    ):
        first, second = parse_split(a_set, a_split), parse_split(b_set, b_split)
        size = get_spec(a_set).splits.get(first.base)
        if a_set == b_set and first.overlaps(second, size):
            raise UserError(
                f"{a} {a_split!r} and {b} {b_split!r} share images of {a_set}; "
                "make them disjoint (e.g. train[:50000] and train[50000:])"
            )
    if p.kind == "groups":
        make_group_classes(p.num_groups, p.classes_per_group, p.class_overlap, spec.num_classes)
    _check_deal(config)
    splits = (d.client_train_split, d.client_test_split)
    if p.kind != "own" and all(
        parse_split(d.client_dataset, s).base in spec.splits for s in splits
    ):
        # Impossible client counts fail here, by arithmetic, before any image is read.
        check_split_sizes(
            p.num_clients,
            p.class_counts,
            p.test_fraction,
            p.disjoint,
            p.kind,
            tuple(split_size(d.client_dataset, s) for s in splits),
            tuple(f"{d.client_dataset}:{s}" for s in splits),
        )


def check_client_sources(config: Config, also: Sequence[tuple[str, str]] = ()) -> None:
    """Refuse, in one line, client data this machine can neither read nor fetch, and the
    same for the ``also`` (dataset, split) pairs (``--knn-proxy``'s)
    (:func:`~cpcfl_tf.data.sources.check_readable`: files and names only, each dataset
    once). A script checks it before its first run, where the loader would otherwise
    fail after the first run's header and TensorFlow's import. Not part of
    :func:`check_data`: a federation's server holds no client data, and the
    pre-training's images are not needed when its encoder is cached."""
    from cpcfl_tf.data.sources import check_readable, parse_split

    d = config.data
    wanted = list(also)
    if config.partition.kind != "own":  # else each node reads its own
        wanted = [
            (d.client_dataset, d.client_train_split),
            (d.client_dataset, d.client_test_split),
            *wanted,
        ]
    bases: dict[str, list[str]] = {}
    for dataset, split in wanted:
        base = parse_split(dataset, split).base
        if base not in bases.setdefault(dataset, []):
            bases[dataset].append(base)
    for dataset, named in bases.items():
        check_readable(dataset, named, d.data_dir, d.manual_dir)


def _check_deal(config: Config) -> None:
    """A federated start's unlabeled deal: labels to deal by group where it needs them,
    a batch for every client."""
    from cpcfl_tf.data.sources import get_spec, parse_split, split_size
    from cpcfl_tf.data.unlabeled import check_deal

    settings = federated_settings(config)
    if settings is None:  # not a federated start
        return
    d, where = config.data, config.partition.unlabeled
    base = parse_split(d.pretrain_dataset, d.pretrain_split).base
    spec = get_spec(d.pretrain_dataset)
    if where == "groups" and base in spec.unlabeled_splits:
        raise UserError(
            f"the groups deal needs labels to deal {d.pretrain_dataset}:"
            f"{d.pretrain_split}'s images by class, and it has none; set "
            "partition.unlabeled=iid"
        )
    if config.partition.kind != "own" and base in spec.splits:
        check_deal(
            split_size(d.pretrain_dataset, d.pretrain_split),
            config.partition.num_clients,
            settings["batch_size"],
            f"{d.pretrain_dataset}:{d.pretrain_split}",
        )
