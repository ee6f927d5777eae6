"""What each method is, in one place.

A run is a method (``federated.method``) started from a starting encoder
(``federated.pretraining``). Everything the kit does differently per method is a field of
its :class:`Method` here; the config, the algorithm, the simulator, the Flower apps and
the runner read these fields and never test a method's name. Adding a method is an entry
in :data:`METHODS` plus, if it needs one, a new rule: a ``Rule`` subclass and its entry in
:mod:`cpcfl_tf.methods.rules` (docs/extending.md lists the files).

This module imports nothing of the kit but its errors, the rules (:mod:`cpcfl_tf.methods.rules`)
and the self-supervised registry (:mod:`cpcfl_tf.methods.ssl`, the pre-training stage's
home), so every layer may read it.
"""

from __future__ import annotations

import dataclasses

from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.rules import RULES, Rule
from cpcfl_tf.methods.ssl import FEDERATED_STARTS, SSL_METHODS
from cpcfl_tf.methods.starts import FEDAVG_ENCODER, START
from cpcfl_tf.plugins import entries, used

PRETRAIN_METHODS = tuple(SSL_METHODS)
"""The server's self-supervised pre-trainings (:mod:`cpcfl_tf.methods.ssl`)."""
FEDERATED_PRETRAININGS = tuple(FEDERATED_STARTS)
"""The self-supervised pre-trainings on the clients' unlabeled images (``fed-simclr``,
..., ``fedema-byol``: :data:`cpcfl_tf.methods.ssl.FEDERATED_STARTS`)."""
START_LABELS = {name: start.label for name, start in START.items()}
"""Every starting encoder (``federated.pretraining``, a name kept for the records: not
every start is a pre-training) and how tables name it: random initialisation, the
server's self-supervised pre-trainings (one per registry entry), the encoder of a FedAvg
(None) run on the same clients (:data:`FEDAVG_ENCODER_RUN`), supervised pre-training,
and the federated self-supervised pre-trainings (:data:`cpcfl_tf.methods.starts.START`)."""
PRETRAININGS = tuple(START)
PRETRAINED = tuple(name for name, start in START.items() if start.pretrained)
"""The starts a pre-trained encoder gives: what CP-CFL needs."""

ASSIGNMENTS = {name: rule.description for name, rule in RULES.items()}
"""The assignment rules (:mod:`cpcfl_tf.methods.rules`) and what each does."""

FEDAVG_ENCODER_RUN = FEDAVG_ENCODER.run
"""(method, starting encoder) of the run whose final global encoder is the ``fedavg``
starting encoder (IFCA (FedAvg), tab:different_methods)."""


@dataclasses.dataclass(frozen=True)
class Method:
    """One method: what it may start from and what its run implies."""

    name: str
    """``federated.method``."""
    label: str
    """How tables name it (with the starting encoder: :func:`run_label`)."""
    starts: tuple[str, ...]
    """The starting encoders it can use."""
    one_model: bool = False
    """A pool of one model (N = 1) whatever ``federated.num_clusters`` says."""
    assign: str = "loss"
    """Who puts each client in a cluster (:data:`ASSIGNMENTS`)."""
    head_phase: bool = False
    """From a pre-trained encoder, the first Tc rounds draw models at random and train
    heads only (Algorithm "CP-CFL"); from random weights there is no Tc phase."""
    restarts: bool = False
    """IFCA's restart rule: start over with a new random pool (from a pre-trained
    encoder: new random heads on it) when clustering failed ``federated.restart_round``
    rounds after the clients began to choose by loss (after the Tc phase, if any)."""
    restarts_of: str = ""
    """The method this one is until its restart rule fires: a run in which the rule never
    fires is that method's run of the same config, bit for bit (attempt 0 draws what the
    other draws), so the :class:`~cpcfl_tf.running.runner.Runner` takes it from that run instead
    of making it again."""
    federated: bool = True
    """False: a centralized baseline (no rounds, no clusters;
    :mod:`cpcfl_tf.clustered.centralized`)."""
    instead: str = ""
    """What to use instead, said when a start is refused."""
    options: dict[str, float] = dataclasses.field(default_factory=dict)
    """The method's own settings and their defaults (``federated.options`` overrides
    them; the run record keeps the values used)."""
    keeps: str = ""
    """What each client keeps of its own between rounds, never sent: ``head`` (the
    classifier head: FedPer, FedRep) or ``encoder`` (LG-FedAvg), in place of that part of
    the shared model, whose rest the server averages (the part sent both ways); ``model``,
    a personal model beside the shared one, which the client trains and sends whole
    (Ditto: the personal model is trained with ``local.prox = options['lambda']`` towards
    the round's shared model). "": every client trains and sends the whole model."""
    schedule: str = ""
    """What the local epochs train: "" as the run says (the Tc phase, ``encoder_epochs``);
    ``head-then-encoder``, the head on the frozen encoder in the first
    ``E - options['rep_epochs']`` epochs, then the encoder under that head (FedRep)."""
    fine_tunes: bool = False
    """Each client is scored with the round's model fine-tuned on its own training data
    for ``options['finetune_epochs']`` local epochs of the whole model (a copy, thrown
    away after it is scored; FedAvg+FT)."""

    def head_rounds(self, pretraining: str, tc: int) -> int:
        """Tc as this method runs it from ``pretraining``."""
        return tc if self.head_phase and START[pretraining].gives_encoder else 0

    @property
    def rule(self) -> Rule:
        """The rule :attr:`assign` names (:data:`cpcfl_tf.methods.rules.RULES`)."""
        return RULES[self.assign]

    def num_models(self, num_clusters: int, num_clients: int, num_groups: int) -> int:
        """N as this method runs it."""
        if self.one_model:
            return 1
        return self.rule.num_models(num_clusters, num_clients, num_groups)

    @property
    def server_assigns(self) -> bool:
        """The server tells each client its model (it is sent that one model only)."""
        return self.rule.server_assigns

    @property
    def on_flower(self) -> bool:
        """Whether the Flower apps run it: a federation that sends something
        (:func:`cpcfl_tf.flower.common.run_config` says why the others cannot)."""
        return self.federated and self.communicates and self.rule.on_flower

    @property
    def asks_first(self) -> str | None:
        """What the server asks every client once, before training (the rule's ``asks``):
        its true group (``group``: the oracle, the only method told it), its data subspace
        (``subspace``: PACFL); ``None`` for the others."""
        return self.rule.asks

    @property
    def communicates(self) -> bool:
        """Whether anything is sent at all (not for clients training alone)."""
        return self.rule.communicates

    def resolve_options(self, given: dict[str, float] | None) -> dict[str, float] | None:
        """The options a run uses: the defaults with ``given`` over them (one-line error
        for a name the method does not have); ``None`` for a method without options."""
        given = dict(given or {})
        unknown = set(given) - set(self.options)
        if unknown:
            known = ", ".join(self.options) or "none"
            raise UserError(
                f"{self.name} has no option(s) {', '.join(sorted(unknown))} in "
                f"federated.options; its options: {known}"
            )
        for name, value in given.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise UserError(f"federated.options {name} must be a number, got {value!r}")
        return {**self.options, **given} if self.options else None

    def check_settings(self, fl) -> None:
        """Refuse, in one line, a resolved ``federated`` section (its ``options`` the
        values used) this method cannot run."""
        options = fl.options or {}

        def whole(name: str, low: int, high: int) -> None:
            value = options[name]
            if value != int(value) or not low <= value <= high:
                raise UserError(
                    f"{self.name}: federated.options {name} must be a whole number from "
                    f"{low} to {high}, got {value}"
                )

        if self.schedule == "head-then-encoder":
            if fl.local_epochs < 2:
                raise UserError(
                    f"{self.name} trains the head, then the encoder: federated.local_epochs "
                    f"must be at least 2, got {fl.local_epochs}"
                )
            whole("rep_epochs", 1, fl.local_epochs - 1)
        if self.fine_tunes:
            whole("finetune_epochs", 1, 1000)
        if self.keeps == "model" and options["lambda"] < 0:
            raise UserError(
                f"{self.name}: federated.options lambda must be >= 0, got {options['lambda']}"
            )

    def check_start(self, pretraining: str) -> None:
        """Refuse, in one line, a starting encoder this method cannot use."""
        if pretraining not in self.starts:
            raise UserError(
                f"{self.name} cannot start from pre-training {pretraining!r}; "
                f"choose one of {', '.join(self.starts)}"
                + (f"; {self.instead}" if self.instead else "")
            )


_FEDERATED_STARTS = ("none", *PRETRAINED)

METHODS = {
    m.name: m
    for m in (
        # FedAvg (SimCLR) etc. is CP-CFL with N = 1, so it has the Tc phase too: the paper
        # prints 59.33 % for both (tab:different_methods and tab:different_clusters).
        Method("fedavg", "FedAvg", _FEDERATED_STARTS, one_model=True, head_phase=True),
        # IFCA: no Tc phase; restarts when clustering fails (Sec. "Baselines").
        Method("ifca", "IFCA", ("none", "fedavg", *PRETRAINED), restarts=True),
        # CP-CFL: a pre-trained encoder and the Tc phase (Algorithm "CP-CFL"); no restart
        # rule (the paper gives it none).
        Method(
            "cp-cfl",
            "CP-CFL",
            PRETRAINED,
            head_phase=True,
            instead="for random initialisation use method ifca",
        ),
        # Beyond the paper: CP-CFL with IFCA's restart rule (new random heads on the same
        # encoder and the Tc phase again, when IFCA's failure test flags the clusters
        # restart_round rounds after Tc; docs/choices.md). Why: at 60 clients CP-CFL merges
        # groups in some runs (experiments/clustering_reliability.py).
        Method(
            "cp-cfl-restart",
            "CP-CFL+restart",
            PRETRAINED,
            head_phase=True,
            restarts=True,
            restarts_of="cp-cfl",
            instead="for random initialisation use method ifca",
        ),
        # The centralized baselines of tab:different_datasets (pooled, or pooled by group).
        Method("centralized", "Centralized", PRETRAININGS, federated=False),
        # The two references of clustered FL: each client alone (the lower one) and FedAvg
        # within each true group (the upper one). From a pre-trained encoder both have the
        # Tc phase, like FedAvg (SimCLR).
        Method("local", "Local", PRETRAININGS, assign="own", head_phase=True),
        Method("oracle", "Oracle", PRETRAININGS, assign="groups", head_phase=True),
        # FeSEM (Long et al., "Multi-center federated learning"): stochastic EM over N
        # centres by the L2 distance of the clients' models.
        Method("fesem", "FeSEM", PRETRAININGS, assign="nearest", head_phase=True),
        # CFL (Sattler, Mueller and Samek, IEEE TNNLS 2020, Algorithm 1): recursive
        # bipartitioning by the updates' cosine similarity, into at most
        # federated.num_clusters clusters. eps1/eps2 bound the norm of a cluster's mean update
        # and of its largest one, max_cross the similarity across the two parts of a split;
        # split_after, min_split_size as in the authors' code (no split before round 20; only
        # clusters of more than two clients). eps1, eps2, max_cross: measured for the kit's
        # models by tools/calibrate_families.py (results/quick/calibrate_families/).
        Method(
            "cfl",
            "CFL",
            PRETRAININGS,
            assign="split",
            head_phase=True,
            options={
                "eps1": 0.82,
                "eps2": 1.44,
                "split_after": 20,
                "min_split_size": 3,
                "max_cross": 0.04,
            },
        ),
        # FL+HC (Briggs, Fan and Andras, IJCNN 2020): FedAvg, then one hierarchical clustering
        # of the updates of round cluster_round (0-based; the kit's choice: docs/choices.md).
        Method(
            "fl-hc",
            "FL+HC",
            PRETRAININGS,
            assign="hierarchical",
            head_phase=True,
            options={"cluster_round": 10},
        ),
        # PACFL (Vahidian et al., AAAI 2023): one clustering before training from each
        # client's `basis` leading singular vectors of its data (Sec. 3); basis chosen on
        # held-out partitions by tools/calibrate_families.py.
        Method(
            "pacfl",
            "PACFL",
            PRETRAININGS,
            assign="subspaces",
            head_phase=True,
            options={"basis": 8},
        ),
        # FedGroup (Duan et al., "FedGroup: Efficient Federated Learning via Decomposed
        # Similarity-Based Clustering", 2021, Sec. 4): a cold start clusters the clients'
        # updates by their decomposed cosine similarity (EDC) with k-means++ into
        # federated.num_clusters groups, the paper's m; static groups after it
        # (docs/choices.md says what did not carry over).
        Method("fedgroup", "FedGroup", PRETRAININGS, assign="decomposed", head_phase=True),
        # Beyond the paper: CP-CFL whose first choice after the Tc phase is made from the
        # frozen encoder's features (k-means over the clients' mean embeddings, as k-FED:
        # Dennis, Li and Smith, ICML 2021) instead of from the heads' losses: a remedy for
        # CP-CFL's merges that adds no round (docs/choices.md).
        Method(
            "cp-cfl-features",
            "CP-CFL+features",
            PRETRAINED,
            head_phase=True,
            assign="features",
            instead="for random initialisation use method ifca",
        ),
        # Personalized FL from the same pool of one model. FedPer (Arivazhagan et al.,
        # "Federated Learning with Personalization Layers", 2019): the base layers (the
        # encoder) are averaged, each client keeps its personalization layers (the head).
        # LG-FedAvg (Liang et al., "Think Locally, Act Globally", 2020): each client keeps
        # its local representation (the encoder), the global layers (the head) are
        # averaged. Local training as the run's (the papers' E and B are the settings).
        Method("fedper", "FedPer", _FEDERATED_STARTS, one_model=True, keeps="head"),
        Method("lg-fedavg", "LG-FedAvg", _FEDERATED_STARTS, one_model=True, keeps="encoder"),
        # FedRep (Collins et al., "Exploiting Shared Representations for Personalized
        # Federated Learning", ICML 2021, Algorithm 1): each client keeps its head and
        # trains it first with the representation (the encoder) frozen, then the encoder
        # under that head; only the encoder is averaged. rep_epochs = 1 of the run's E
        # local epochs, as the authors' code splits them (local_rep_ep = 1, the head gets
        # local_ep - local_rep_ep).
        Method(
            "fedrep",
            "FedRep",
            _FEDERATED_STARTS,
            one_model=True,
            keeps="head",
            schedule="head-then-encoder",
            options={"rep_epochs": 1},
        ),
        # Ditto (Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning
        # Through Personalization", ICML 2021, Algorithm 1): the global model is FedAvg's;
        # each client also keeps a personal model trained on min F_k(v) + lambda / 2
        # ||v - w||^2 towards the round's global w, and is scored with it. lambda = 1:
        # the authors' runs on Fashion-MNIST (run_fashion_clean_ditto_lam1.sh).
        Method(
            "ditto",
            "Ditto",
            _FEDERATED_STARTS,
            one_model=True,
            keeps="model",
            options={"lambda": 1.0},
        ),
        # FedAvg+FT: FedAvg as the kit runs it (the Tc phase from a pre-trained encoder),
        # each client scored after fine-tuning the round's global model on its own
        # training data for 5 local epochs: the FedAvg fine-tuning of FedBABU (Oh, Kim and
        # Yun, ICLR 2022), whose personalized accuracy is read after 5 epochs.
        Method(
            "fedavg-ft",
            "FedAvg+FT",
            _FEDERATED_STARTS,
            one_model=True,
            head_phase=True,
            fine_tunes=True,
            options={"finetune_epochs": 5},
        ),
    )
}
METHODS.update(entries("cpcfl_tf.methods", Method, METHODS))
"""Every method, by ``federated.method``: the kit's, then the installed plugins'
(:mod:`cpcfl_tf.plugins`)."""


def get_method(name: str) -> Method:
    """The :class:`Method` called ``name`` (one-line error naming the choices)."""
    try:
        return METHODS[name]
    except KeyError:
        raise UserError(
            f"unknown federated.method {name!r}; choose one of {', '.join(METHODS)}"
        ) from None


def plugins_used(method: str, pretraining: str) -> dict[str, str]:
    """The entries of installed plugins (:mod:`cpcfl_tf.plugins`) a run of ``method``
    from ``pretraining`` uses, with their package and version: what its record's
    ``environment.plugins`` says (empty for the kit's own)."""
    start = START[pretraining]
    return used(
        method=method,
        rule=get_method(method).assign,
        ssl_method=start.ssl_method,
        federated_ssl=start.federated.name if start.federated else "",
    )


def run_label(method: str, pretraining: str) -> str:
    """A run's name in tables, e.g. ``CP-CFL (SimCLR)``."""
    return f"{get_method(method).label} ({START_LABELS[pretraining]})"
