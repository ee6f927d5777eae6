"""The run record: what every run writes (docs/run-record.md;
``docs/run-record.schema.json`` is its contract for outside tools).

The simulator, the centralized baselines and the Flower server build a :class:`RunRecord`;
the runner adds where it ran and writes it with :meth:`RunRecord.to_json`; scripts read it
back with :func:`read_record` and use its fields (``record.final.accuracy``,
``record.config.federated.rounds``), never nested strings. ``to_json`` writes the keys in
one fixed order, so reading a record and writing it again gives the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from cpcfl_tf.methods.starts import START
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.identity import config_record
from cpcfl_tf.plan.resolve import as_stored
from cpcfl_tf.records.files import read_file, write_json

SCORES = (
    "f1_macro",
    "f1_weighted",
    "auroc_ovr_macro",
    "auroc_ovr_weighted",
    "auroc_ovo_macro",
    "auroc_ovo_weighted",
)
"""Pooled F1 and AUROC (tab:addition_scores), at the reporting rounds and at the end."""


def _only(data: dict, known: set[str], what: str) -> None:
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {what} field(s) {', '.join(sorted(unknown))}")


@dataclasses.dataclass
class Round:
    """One finished round."""

    round: int
    """1..T."""
    cluster_ids: list[int]
    """Per client; -1 before its first round."""
    accuracy: float | None = None
    """Mean client accuracy on the clients' test data; None in the rounds
    ``federated.eval_every`` skips (Flower: over the nodes that answered)."""
    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    """:data:`SCORES`, at the reporting rounds only."""
    replies: int | None = None
    """Flower: how many nodes replied."""
    failed_partitions: list[int] | None = None
    """Flower: the clients asked (to train or to be scored) that did not reply."""
    split_test: dict[str, dict[str, float | None]] | None = None
    """CFL: for each cluster that trained (by id), what its split test compares:
    ``mean_norm`` (of its members' weighted mean update, with ``eps1``), ``max_norm`` (the
    largest update norm, with ``eps2``) and ``cross_similarity`` (of its bipartition, with
    ``max_cross``; null for a single member)."""
    selection: dict[str, list] | None = None
    """The selection diagnostic (runs made with ``--diagnose``): ``clients`` (who chose),
    ``losses`` (each one's loss on every pool model) and ``margins`` (second-lowest minus
    lowest loss), :mod:`cpcfl_tf.clustered.diagnostics`."""
    too_few_to_defend: list[int] | None = None
    """A robust ``federated.aggregation`` only, where it happened: the clusters whose
    members were too few for it to out-vote one bad member (:mod:`cpcfl_tf.aggregation`)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"round": self.round}
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy
        out["cluster_ids"] = self.cluster_ids
        out.update({k: self.scores[k] for k in SCORES if k in self.scores})
        if self.split_test is not None:
            out["split_test"] = self.split_test
        if self.selection is not None:
            out["selection"] = self.selection
        if self.too_few_to_defend is not None:
            out["too_few_to_defend"] = self.too_few_to_defend
        if self.replies is not None:
            out.update(replies=self.replies, failed_partitions=self.failed_partitions)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Round:
        _only(
            data,
            {
                "round",
                "accuracy",
                "cluster_ids",
                "replies",
                "failed_partitions",
                "split_test",
                "selection",
                "too_few_to_defend",
                *SCORES,
            },
            "round",
        )
        return cls(
            data["round"],
            data["cluster_ids"],
            data.get("accuracy"),
            {k: data[k] for k in SCORES if k in data},
            data.get("replies"),
            data.get("failed_partitions"),
            data.get("split_test"),
            data.get("selection"),
            data.get("too_few_to_defend"),
        )


@dataclasses.dataclass
class Final:
    """The run's result (the contract's metrics)."""

    accuracy: float | None
    """Mean client accuracy at the last round (None: no Flower node answered it)."""
    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    epochs: int | None = None
    """Centralized runs: epochs over the pooled data."""
    client_accuracy: dict[str, float] | None = None
    """Flower: each answering node's accuracy, by partition id."""
    ari: float | None = None
    """Adjusted Rand index of the final cluster ids against the true groups."""
    restarts: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    model_bytes: int | None = None
    bytes_other: int = 0
    """What the clients sent besides weights (PACFL's data subspaces), counted in
    ``bytes_up`` too; written only when not 0."""
    bytes_kept: int = 0
    """What the clients keep of their own between rounds and never send (a personalized
    method's heads, encoders or personal models), all clients together; written only
    when not 0."""

    def metric(self, name: str) -> float | None:
        """``accuracy`` or one of :data:`SCORES`."""
        return self.accuracy if name == "accuracy" else self.scores[name]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accuracy": self.accuracy}
        out.update({k: self.scores[k] for k in SCORES if k in self.scores})
        if self.epochs is not None:
            out["epochs"] = self.epochs
        if self.client_accuracy is not None:
            out["client_accuracy"] = self.client_accuracy
        out.update(
            ari=self.ari, restarts=self.restarts, bytes_down=self.bytes_down, bytes_up=self.bytes_up
        )
        if self.model_bytes is not None:
            out["model_bytes"] = self.model_bytes
        if self.bytes_other:
            out["bytes_other"] = self.bytes_other
        if self.bytes_kept:
            out["bytes_kept"] = self.bytes_kept
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Final:
        fields = {f.name for f in dataclasses.fields(cls)} - {"scores"}
        _only(data, fields | set(SCORES), "final")
        return cls(
            scores={k: data[k] for k in SCORES if k in data},
            **{k: v for k, v in data.items() if k in fields},
        )


@dataclasses.dataclass
class RunRecord:
    """Everything one run leaves: settings, clients, every round, the result."""

    config: Config
    """The settings as the run used them (a federated run's ``federated`` resolved for its
    method, :func:`~cpcfl_tf.plan.resolve.resolve`)."""
    requested: Config
    """The settings as the script asked for them (what "same config?" compares)."""
    seeds: dict[str, int]
    """``data`` (the partition) and ``train`` (initialisation, selection, batches)."""
    clients: list[dict[str, Any]]
    """Per client: id, true group, class counts of its training and test data (a Flower
    server, which never sees them, leaves this empty)."""
    rounds: list[Round]
    final: Final
    timing: dict[str, float | None]
    """``seconds`` and ``seconds_per_round`` (``None`` for centralized runs)."""
    experiment: str = ""
    """The script that wrote it."""
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    nodes: dict[str, int] | None = None
    """Flower: node id -> client id (the partition id, or the rank of the node's data
    folder name when nodes bring their own data)."""
    node_data: dict[str, dict[str, Any]] | None = None
    """Flower with nodes' own data: client id -> ``name`` (the data folder's),
    ``num_train`` and ``num_test`` (example counts), as the nodes reported them."""
    count_caps: dict[str, int] | None = None
    """Flower with nodes' own data and no ``max-examples``: the most examples a reply
    weighs, by kind (``train``: the clustered rounds'; ``unlabeled``: a federated
    pre-training's), the lower median of what the nodes reported: a node's own count
    weighs min(count, cap)."""

    @property
    def preset(self) -> str:
        return self.config.preset

    @property
    def method(self) -> str:
        return self.config.federated.method

    @property
    def pretraining(self) -> str:
        return self.config.federated.pretraining

    @property
    def from_random_weights(self) -> bool:
        """Whether the run started from random weights (its start gives no encoder)."""
        return not START[self.pretraining].gives_encoder

    @property
    def pretraining_key(self) -> tuple | None:
        """What names one server pre-training (method, its settings, data and seed): runs
        with the same key should start from one encoder. None for a start that is no
        shared pre-training: random weights, or FedAvg's encoder (each run's own)."""
        start = START.get(self.pretraining)
        if start is not None and not start.shared:
            return None
        data = self.config.data
        settings = dataclasses.replace(self.config.pretrain, seed=None)
        key: tuple[str | int, ...] = (
            self.pretraining,
            repr(settings),
            data.pretrain_dataset,
            data.pretrain_split,
            data.image_size,
            self.config.pretrain_seed,
        )
        if start is not None and start.federated:  # also the clients it was dealt to
            key += (
                repr(self.config.partition),
                self.config.seed,
                data.client_dataset,
                data.client_train_split,
            )
        return key

    @property
    def final_accuracy(self) -> float:
        """The final mean client accuracy; a run without one (no Flower node answered its
        last evaluation) is refused in one line."""
        if self.final.accuracy is None:
            raise ValueError(f"a {self.experiment} run has no final accuracy: no client answered")
        return self.final.accuracy

    def accuracy_at(self, round_: int) -> float:
        """Mean client accuracy after ``round_`` finished rounds (refused, in one line, for
        a round the run did not evaluate: ``federated.eval_every``)."""
        accuracy = next(r.accuracy for r in self.rounds if r.round == round_)
        if accuracy is None:
            raise ValueError(
                f"round {round_} of this {self.experiment} run was not evaluated "
                "(federated.eval_every); read an evaluated round"
            )
        return accuracy

    def best_accuracy(self) -> float:
        """The best mean client accuracy over the rounds."""
        return max(r.accuracy for r in self.rounds if r.accuracy is not None)

    def last_cluster_change(self) -> int:
        """The round after which no client changed its cluster again (1 if none did)."""
        ids = [r.cluster_ids for r in self.rounds]
        return max([1] + [k + 1 for k in range(1, len(ids)) if ids[k] != ids[k - 1]])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "experiment": self.experiment,
            "preset": self.preset,
            "method": self.method,
            "pretraining": self.pretraining,
            "config": {**self.config.to_dict(), "requested": config_record(self.requested)},
            "seeds": self.seeds,
        }
        if self.nodes is not None:
            out["nodes"] = self.nodes
        if self.node_data is not None:
            out["node_data"] = self.node_data
        if self.count_caps is not None:
            out["count_caps"] = self.count_caps
        out.update(
            clients=self.clients,
            rounds=[r.to_json() for r in self.rounds],
            final=self.final.to_json(),
            timing=self.timing,
            environment=self.environment,
        )
        return _plain(out)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        _only(
            data,
            {
                "experiment",
                "preset",
                "method",
                "pretraining",
                "config",
                "seeds",
                "nodes",
                "node_data",
                "count_caps",
                "clients",
                "rounds",
                "final",
                "timing",
                "environment",
            },
            "record",
        )
        stored = dict(data["config"])
        requested = Config.from_dict(stored.pop("requested"))
        config = Config.from_dict(stored)
        config = as_stored(config)
        record = cls(
            config,
            requested,
            data["seeds"],
            data["clients"],
            [Round.from_json(r) for r in data["rounds"]],
            Final.from_json(data["final"]),
            data["timing"],
            data["experiment"],
            data["environment"],
            data.get("nodes"),
            data.get("node_data"),
            data.get("count_caps"),
        )
        said = (data["preset"], data["method"], data["pretraining"])
        if said != (record.preset, record.method, record.pretraining):
            raise ValueError(f"preset, method, pretraining {said} disagree with the config")
        return record


def _plain(value: Any) -> Any:
    """JSON-ready copy: tuples as lists (as ``json`` writes them anyway)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def read_record(path: str | os.PathLike) -> RunRecord:
    """A run record the kit wrote; damage or an older layout is one line naming the fix."""

    def load(p: Path) -> RunRecord:
        return RunRecord.from_json(json.loads(p.read_text()))

    return read_file(
        path,
        load,
        fix="delete it to run it again, or restore it (e.g. git "
        "checkout); records of an older kit: python "
        "tools/migrate_records.py FOLDER",
    )


def write_record(path: str | os.PathLike, record: RunRecord) -> Path:
    """Write ``record`` atomically (:func:`cpcfl_tf.records.files.write_json`)."""
    return write_json(path, record.to_json())
