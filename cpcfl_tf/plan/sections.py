"""The four sections of a run's config (data, partition, pre-training, federated), each
checking itself in ``__post_init__`` with a one-line :class:`~cpcfl_tf.errors.UserError`
that names the fix, and how a stored section reads back (:func:`with_defaults`,
:func:`read_section`). The federated section also says when clients are scored
(:attr:`FederatedConfig.quarters`, :meth:`FederatedConfig.scored`).

The whole request is :class:`cpcfl_tf.plan.config.Config`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from cpcfl_tf.aggregation import AGGREGATIONS
from cpcfl_tf.compat import read_federated, read_pretrain
from cpcfl_tf.errors import require
from cpcfl_tf.methods.federated import METHODS, PRETRAININGS
from cpcfl_tf.plan.choices import (
    ENCODERS,
    HEADS,
    LOCAL_OPTIMIZERS,
    LR_SCHEDULES,
    MIN_IMAGE_SIZE,
    OPTIMIZER_STATES,
    PRECISIONS,
    require_choice,
    require_positive,
)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the unlabeled pre-training images and the clients' labeled images come from."""

    pretrain_dataset: str = "stl10"
    pretrain_split: str = "unlabelled"
    client_dataset: str = "stl10"
    client_train_split: str = "train"
    client_test_split: str = "test"
    image_size: int = 96
    data_dir: str | None = None
    manual_dir: str | None = None

    def __post_init__(self) -> None:
        from cpcfl_tf.data.specs import check_split_text  # reads nothing

        for split in (self.pretrain_split, self.client_train_split, self.client_test_split):
            check_split_text(split)
        require(
            isinstance(self.image_size, int) and self.image_size >= MIN_IMAGE_SIZE,
            f"data.image_size must be an integer >= {MIN_IMAGE_SIZE} (the CNN encoder needs "
            f"31 px), got {self.image_size!r}",
        )


@dataclasses.dataclass(frozen=True)
class PartitionConfig:
    """The clients: :func:`cpcfl_tf.data.partition.partition_clients` takes these."""

    num_clients: int = 60
    num_groups: int = 3
    classes_per_group: int = 4
    class_overlap: int = 1
    class_counts: tuple[int, ...] = (20, 20, 5, 5)
    test_fraction: float = 1.0
    disjoint: bool = True
    kind: str = "groups"
    """groups: the paper's class groups; rotated: all classes, each group's images turned
    by its own quarter turns (IFCA's benchmark); dirichlet: label skew, each group's class
    distribution drawn from Dir(alpha). The other kinds use sum(class_counts) images per
    client and ignore classes_per_group / class_overlap. own: each client brings its own
    data (the Flower ServerApp sets it for nodes with a data-path): nothing is drawn, the
    splits' sizes are not checked, and there is one group."""
    alpha: float = 1.0
    """Concentration of the dirichlet kind (small: few classes per group)."""
    unlabeled: str = "server"
    """Where the unlabeled pre-training images are: server (the paper's) | iid: dealt to
    the clients uniformly at random | groups: each client's drawn from its own class
    distribution (labels deal the images, training never sees them). The federated
    starts (``fed-simclr``, ...) pre-train on the clients' (:mod:`cpcfl_tf.data.unlabeled`)."""

    def __post_init__(self) -> None:
        from cpcfl_tf.data.partition import check_partition  # no TF import
        from cpcfl_tf.data.unlabeled import DEALS

        require_choice("partition", "unlabeled", self.unlabeled, DEALS)

        object.__setattr__(self, "class_counts", tuple(self.class_counts))
        check_partition(
            self.num_clients,
            self.num_groups,
            self.classes_per_group,
            self.class_overlap,
            self.class_counts,
            self.test_fraction,
            self.kind,
            self.alpha,
        )


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """How the server pre-trains (Sec. "Experimental settings"). *Which* method
    (SimCLR, BYOL, SimSiam, VICReg, supervised) is the run's ``federated.pretraining``: one
    name, in one place; each method's own settings (SimCLR's temperature, BYOL's target
    rate, the projector's width, ...) are its registry entry's
    (:mod:`cpcfl_tf.methods.ssl`), overridden in :attr:`options`."""

    encoder: str = "cnn"
    """The encoder network (:data:`ENCODERS`): the one the server pre-trains and the one
    every client model of the federated stage builds (its single setting; records also
    name it as ``federated.encoder``, :func:`cpcfl_tf.compat.stored_federated`)."""
    epochs: int = 300
    batch_size: int = 500
    learning_rate: float = 1e-3
    augment: dict[str, Any] | None = None
    """Overrides of :data:`cpcfl_tf.data.augment.DEFAULT_STRENGTHS`."""
    jit_compile: bool = False
    """XLA for the train step (pass explicitly: Keras' "auto" differs on CPU and GPU)."""
    precision: str = "float32"
    """Keras dtype policy of the step: float32, mixed_float16 or mixed_bfloat16 (GPU)."""
    seed: int | None = None
    """The pre-training's seed; None: the run's seed (:attr:`Config.pretrain_seed`). Set,
    runs of other seeds share one encoder (``experiments/clustering_reliability.py``);
    which encoder it names is the cache key's ``seed``, not part of its settings."""
    options: dict[str, dict[str, Any]] | None = None
    """Per-method settings away from the registry's defaults, e.g. ``{"simclr":
    {"projector_dim": 512}}`` (checked, and kept without the defaults; the run record
    names every setting of the run's method with its value)."""
    lr_schedule: str = "constant"
    """constant (the paper's Adam at ``learning_rate``) | cosine: ``warmup_epochs`` of
    linear warm-up from 0, then cosine decay to 0 (SimCLR, Sec. B.1; solo-learn's and
    lightly's "warmup_cosine")."""
    warmup_epochs: int = 0
    """Epochs of linear warm-up of the cosine schedule (SimCLR used 10 of its 100+)."""

    def __post_init__(self) -> None:
        from cpcfl_tf.methods.ssl import check_options

        require(
            self.seed is None
            or (isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0),
            f"pretrain.seed must be a non-negative integer or none, got {self.seed!r}",
        )
        object.__setattr__(self, "options", check_options(self.options))
        require_choice("pretrain", "precision", self.precision, PRECISIONS)
        require_choice("pretrain", "encoder", self.encoder, ENCODERS)
        require_choice("pretrain", "lr_schedule", self.lr_schedule, LR_SCHEDULES)
        require_positive(
            "pretrain",
            epochs=self.epochs,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
        )
        require(
            isinstance(self.warmup_epochs, int) and 0 <= self.warmup_epochs < self.epochs,
            f"pretrain.warmup_epochs must be an integer in [0, epochs={self.epochs}), "
            f"got {self.warmup_epochs!r}",
        )
        require(
            self.warmup_epochs == 0 or self.lr_schedule != "constant",
            "pretrain.warmup_epochs warms up the cosine schedule; set "
            "pretrain.lr_schedule=cosine too",
        )

    def settings(self, method) -> dict[str, Any]:
        """Every setting of self-supervised ``method`` (its name, or its registry entry as
        a run's plan carries it) with the value it runs with."""
        from cpcfl_tf.methods.ssl import get_ssl_method

        entry = get_ssl_method(method) if isinstance(method, str) else method
        return entry.resolve((self.options or {}).get(entry.name))

    def with_settings(self, method: str, **values: Any) -> PretrainConfig:
        """Copy with ``method``'s settings ``values`` over the ones set (checked)."""
        options = dict(self.options or {})
        options[method] = {**options.get(method, {}), **values}
        return dataclasses.replace(self, options=options)


@dataclasses.dataclass(frozen=True)
class FederatedConfig:
    """The clustered FL stage (Algorithm "CP-CFL", Sec. "Experimental settings")."""

    method: str = "cp-cfl"
    pretraining: str = "simclr"
    num_clusters: int = 3
    rounds: int = 100
    head_rounds: int = 10
    """Tc: rounds of random selection with a frozen encoder."""
    local_epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 1e-3
    head: str = "c"
    encoder_epochs: int | None = None
    """E_l,f: local epochs (the first ones) in which the encoder trains; None = all."""
    global_encoder: bool = False
    """Average the encoders of all clusters into one shared encoder (heads per cluster)."""
    participation: float = 1.0
    """Fraction of clients drawn (seeded) to take part in each round."""
    max_restarts: int = 5
    """Restarts a method with IFCA's restart rule (IFCA, CP-CFL+restart) may make. This
    and the next two are every method's fields, not IFCA's ``options``: the failure test
    is judged on every clustered run (docs/choices.md, "IFCA restarts")."""
    restart_round: int = 10
    """IFCA (and CP-CFL+restart): clustering failure is checked this many rounds after
    the clients began to choose by loss (after Tc, if any)."""
    min_cluster_share: float = 0.5
    """The failure test: a cluster with fewer than this share of N-th of the clients
    has failed (IFCA's restart rule acts on it; the evidence reads it for every run)."""
    report_every: int = 25
    """F1/AUROC are computed every this many rounds and at the end (paper: 25/50/75/100)."""
    eval_every: int = 1
    """Every client is scored on its test data every this many rounds and at the rounds
    the tables report (:attr:`quarters`, every ``report_every`` round, the last); the
    rounds between record no accuracy (null). 1, every round, is the paper's curve; with
    many clients taking part a few at a time, scoring all of them is most of a round."""
    centralized_epochs: int | None = None
    """Epochs of the centralized baselines; None = rounds * local_epochs (the passes a
    client makes over its own data in a federated run)."""
    backend: str = "auto"
    """auto | stacked (all clients in one step; CNN only) | keras (one client at a time)."""
    local_optimizer: str = "adam"
    """adam (the paper's, Sec. "Experimental settings") | sgd (plain gradient steps)."""
    optimizer_state: str = "fresh"
    """fresh: a new optimizer state per client per round (docs/choices.md) | client: each
    client keeps its own Adam moments and step count from round to round."""
    options: dict[str, float] | None = None
    """The method's own settings, e.g. ``{"eps1": 0.3}`` for CFL (docs/extending.md);
    the record's resolved config shows every value used."""
    jit_compile: bool = False
    """XLA-compile the local training step (both backends): one compile per client count
    and batch shape, other kernels, so other last bits than the default (docs/performance.md,
    "Settings that were timed and gave no gain")."""
    frozen_features: bool = False
    """In a local epoch that freezes the encoder (the Tc phase; the epochs after
    ``encoder_epochs``), compute each client's features by the frozen encoder once per
    round, in batches of ``batch_size``, and train the head on them, instead of running
    the encoder in every step of every such epoch: faster heads-only epochs, other last
    bits (a feature's bits depend on the batch it was computed in), so off by default
    (docs/performance.md, "A faster path"). Stacked backend only."""
    aggregation: str = "mean"
    """How each cluster's members, and each round's clients of a federated pre-training,
    are combined (:mod:`cpcfl_tf.aggregation`, which says what each tolerates): mean, the
    paper's |D_u|-weighted mean (Eq. weighted_avg) | median, the coordinate-wise median |
    trimmed-mean, the coordinate-wise mean without the largest and smallest values (Yin et
    al., "Byzantine-Robust Distributed Learning", ICML 2018; Flower's FedMedian and
    FedTrimmedAvg); both unweighted, as there, and both refused where a combination can
    have fewer than 3 members unless ``update_norm`` bounds it."""
    trim_fraction: float = 0.2
    """The share beta cut from each end by ``trimmed-mean`` (Flower's FedTrimmedAvg's beta
    and its default; Yin et al. 2018: at least the share of bad members): of n members
    int(beta * n) go each way, at least one whenever n >= 3."""
    update_norm: float | None = None
    """Bound each reply's update (its weights minus the model it was sent) to this L2
    norm over all its arrays before it counts, in both stages (Sun et al., "Can You Really
    Backdoor Federated Learning?", 2019); None: no bound (the paper's)."""

    def participants(self, num_clients: int) -> int:
        """How many of ``num_clients`` clients take part in a round (``participation``)."""
        return max(1, int(round(self.participation * num_clients)))

    def __post_init__(self) -> None:
        require_choice("federated", "method", self.method, tuple(METHODS))
        from cpcfl_tf.methods.ssl import federated_start

        federated_start(self.pretraining)  # e.g. fedema-simclr: why not, and what instead
        require_choice("federated", "pretraining", self.pretraining, PRETRAININGS)
        require_choice("federated", "head", self.head, HEADS)
        require_choice("federated", "backend", self.backend, ("auto", "stacked", "keras"))
        require_choice("federated", "local_optimizer", self.local_optimizer, LOCAL_OPTIMIZERS)
        require_choice("federated", "optimizer_state", self.optimizer_state, OPTIMIZER_STATES)
        require(
            isinstance(self.jit_compile, bool),
            f"federated.jit_compile must be true or false, got {self.jit_compile!r}",
        )
        require(
            isinstance(self.frozen_features, bool),
            f"federated.frozen_features must be true or false, got {self.frozen_features!r}",
        )
        require_choice("federated", "aggregation", self.aggregation, AGGREGATIONS)
        require(
            isinstance(self.trim_fraction, (int, float))
            and not isinstance(self.trim_fraction, bool)
            and 0 <= self.trim_fraction < 0.5,
            f"federated.trim_fraction must be in [0, 0.5), got {self.trim_fraction!r}",
        )
        if self.update_norm is not None:
            require_positive("federated", update_norm=self.update_norm)
        require_positive(
            "federated",
            num_clusters=self.num_clusters,
            rounds=self.rounds,
            local_epochs=self.local_epochs,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            participation=self.participation,
            report_every=self.report_every,
            eval_every=self.eval_every,
        )
        require(
            isinstance(self.head_rounds, int) and 0 <= self.head_rounds < self.rounds,
            f"federated.head_rounds (Tc) must be in [0, rounds={self.rounds}), "
            f"got {self.head_rounds}",
        )
        require(
            self.encoder_epochs is None or 0 <= self.encoder_epochs <= self.local_epochs,
            f"federated.encoder_epochs must be in [0, local_epochs={self.local_epochs}], "
            f"got {self.encoder_epochs}",
        )
        require(
            self.participation <= 1,
            f"federated.participation must be in (0, 1], got {self.participation}",
        )
        require(
            self.max_restarts >= 0 and self.restart_round >= 1 and self.min_cluster_share >= 0,
            "federated.max_restarts >= 0, restart_round >= 1 and min_cluster_share >= 0",
        )
        require(
            self.centralized_epochs is None or self.centralized_epochs >= 1,
            f"federated.centralized_epochs must be positive, got {self.centralized_epochs}",
        )
        require(
            self.optimizer_state == "fresh" or self.local_optimizer == "adam",
            "federated.optimizer_state 'client' keeps Adam's moments; "
            f"local_optimizer {self.local_optimizer!r} has none (use fresh)",
        )
        METHODS[self.method].check_start(self.pretraining)
        METHODS[self.method].resolve_options(self.options)

    @property
    def encoder_trains(self) -> int:
        return self.local_epochs if self.encoder_epochs is None else self.encoder_epochs

    @property
    def quarters(self) -> list[int]:
        """The rounds the tables report: the paper's T = 25/50/75/100 of 100 rounds are
        the quarters of the run."""
        return [math.ceil(self.rounds * q / 4) for q in (1, 2, 3, 4)]

    def scored(self, round_: int) -> bool:
        """Whether every client is scored on its test data after round ``round_``
        (counting from 1): every ``eval_every`` round and every round a report reads."""
        return (
            round_ % self.eval_every == 0
            or round_ % self.report_every == 0
            or round_ == self.rounds
            or round_ in self.quarters
        )


SECTIONS = {
    "data": DataConfig,
    "partition": PartitionConfig,
    "pretrain": PretrainConfig,
    "federated": FederatedConfig,
}


def read_section(section: str, stored: dict[str, Any]) -> dict[str, Any]:
    if section == "pretrain":
        return read_pretrain(stored)
    return read_federated(stored)[0] if section == "federated" else stored


def with_defaults(section: str, stored: dict[str, Any]) -> dict[str, Any]:
    """``stored`` (a section as a result file recorded it) with the fields added to the
    section since then, at their defaults: an old record of the same settings then equals
    a new one."""
    filled = dict(stored)
    for field in dataclasses.fields(SECTIONS[section]):
        if field.name not in filled and field.default is not dataclasses.MISSING:
            filled[field.name] = field.default
    return filled
