"""What a node sends, turned into the server's typed values: the one place a federation's
server reads a node's reply (docs/flower.md, "What is and is not secured").

A node is not trusted. Each reply kind has one parser here (the roster's
:func:`identity`, the first question's :func:`answered`, a round's :func:`trained`, a
scored round's :func:`scored`, a federated pre-training's :func:`pretrained`): it reads
every field the server uses, checks its type, range and (for arrays) number, shape,
dtype and finiteness, refuses a missing or an extra field, and returns a frozen value
the server uses instead of the message. What is wrong raises :class:`Refused` naming the
field; the ServerApp (:func:`cpcfl_tf.flower.remote.parsed`) turns that, or any other
exception a node's content causes, into that node's failure for the round. Text a node
sent is only ever printed through :func:`shown`. Pure NumPy; the ClientApp
(:mod:`cpcfl_tf.flower.client_app`) checks every model it is sent with
:func:`weights_problem`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SHOWN = 120
"""The most characters of a node's text a log line shows."""


class Refused(Exception):
    """A node's reply that cannot count: which field, and what is wrong with it."""


def shown(text: Any, limit: int = SHOWN) -> str:
    """``text`` as a log line may show it: every control and non-printable character
    escaped (a node cannot start a line of its own, e.g. a forged ``[cpcfl]`` one), cut
    to ``limit`` characters."""
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return escaped if len(escaped) <= limit else escaped[:limit] + f"... ({len(escaped)} chars)"


def integer(value: Any, field: str, low: int, high: float = math.inf) -> int:
    """``value`` as an integer in [``low``, ``high``]: an int (not a bool, not a float such
    as 0.9 or inf), else :class:`Refused`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise Refused(f"{field} {shown(value)} is not an integer")
    if not low <= value <= high:
        raise Refused(f"{field} {int(value)} is outside {low}..{_bound(high)}")
    return int(value)


def real(value: Any, field: str, low: float = -math.inf, high: float = math.inf) -> float:
    """``value`` as a finite number in [``low``, ``high``], else :class:`Refused`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise Refused(f"{field} {shown(value)} is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise Refused(f"{field} {number!r} is not a finite number")
    if not low <= number <= high:
        raise Refused(f"{field} {number!r} is outside [{low:g}, {_bound(high)}]")
    return number


def _bound(high: float) -> str:
    return "" if high == math.inf else f"{high:g}"


def fields(
    record: Any, kind: type, name: str, required: Sequence[str], optional: Sequence[str] = ()
) -> Mapping[str, Any]:
    """The record ``name`` of a reply, of Flower type ``kind``, holding every ``required``
    key, maybe the ``optional`` ones, and nothing else."""
    if not isinstance(record, kind) or not isinstance(record, Mapping):
        raise Refused(f"{name} is a {type(record).__name__}, not a {kind.__name__}")
    keys = set(record.keys())
    missing = [k for k in required if k not in keys]
    if missing:
        raise Refused(f"{name} lacks {', '.join(missing)}")
    extra = sorted(keys - set(required) - set(optional))
    if extra:
        raise Refused(f"{name} holds unknown {', '.join(shown(k, 40) for k in extra)}")
    return record


def records(content: Any, *names: str) -> None:
    """A reply's content holds exactly the records ``names``."""
    keys = set(content.keys())
    missing, extra = [n for n in names if n not in keys], sorted(keys - set(names))
    if missing:
        raise Refused(f"the reply lacks its {', '.join(missing)}")
    if extra:
        raise Refused(f"the reply holds unknown records {', '.join(shown(k, 40) for k in extra)}")


def arrays(record: Any, like: Sequence[np.ndarray], name: str = "model") -> list[np.ndarray]:
    """An array record's arrays, checked against ``like`` (:func:`weights_problem`)."""
    from flwr.app import ArrayRecord

    if not isinstance(record, ArrayRecord):
        raise Refused(f"{name} is a {type(record).__name__}, not an ArrayRecord")
    got = record.to_numpy_ndarrays()
    problem = weights_problem(got, like)
    if problem is not None:
        raise Refused(f"{name}: {problem}")
    return got


def weights_problem(arrays: Sequence[np.ndarray], like: Sequence[np.ndarray]) -> str | None:
    """``arrays`` against the model ``like`` they should be: their number, each one's shape
    and dtype, and every value finite (None: nothing wrong)."""
    if len(arrays) != len(like):
        return f"{len(arrays)} weight arrays where the model has {len(like)}"
    for i, (got, want) in enumerate(zip(arrays, like)):
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape:
            return f"weight array {i} has shape {got.shape}, the model's {want.shape}"
        if got.dtype != want.dtype:
            return f"weight array {i} is {got.dtype}, the model's {want.dtype}"
        if not np.isfinite(got).all():
            return f"weight array {i} holds non-finite values"
    return None


def _metrics(content: Any, required: Sequence[str], optional: Sequence[str] = ()):
    from flwr.app import MetricRecord

    return fields(content["metrics"], MetricRecord, "metrics", required, optional)


def _client(metrics: Mapping[str, Any], client: int) -> int:
    said = integer(metrics["client-id"], "client-id", 0)
    if said != client:
        raise Refused(f"client-id {said} is not the node's client {client}")
    return said


@dataclasses.dataclass(frozen=True)
class Identity:
    """A roster reply: the node's partition id (and the partitions it was started for),
    or its data folder's name and example counts."""

    partition: int | None = None
    declared: int | None = None
    name: str | None = None
    num_train: int | None = None
    num_test: int | None = None
    num_unlabeled: int | None = None


def identity(
    content: Any, *, num_clients: int, own: bool, most: int | None = None, unlabeled: bool = False
) -> Identity:
    """A roster reply as the run config says the nodes were started (``own``: the run
    config's ``node-data``): ``partition-id`` in 0..``num_clients`` - 1 (and
    ``num-partitions``, ``num_clients`` itself), or with ``own`` ``name``, ``num-train``,
    ``num-test`` (and ``num-unlabeled``, required when ``unlabeled``: the run pre-trains
    on the nodes), every count at most ``most`` (None: no bound). A reply of the other
    kind is refused: the operator's word decides, never a node's."""
    from flwr.app import ConfigRecord

    records(content, "identity")
    said = content["identity"]
    high = math.inf if most is None else most
    named = isinstance(said, ConfigRecord) and "name" in said
    if named != own:
        raise Refused(
            "a data-path, where the run config says its nodes are partitions "
            "(node-data partition; set node-data='own' for nodes with their own data)"
            if named
            else "a partition-id, where the run config says its nodes bring "
            "their own data (node-data own)"
        )
    if named:
        fields(
            said, ConfigRecord, "identity", ("name", "num-train", "num-test"), ("num-unlabeled",)
        )
        name = said["name"]
        if not isinstance(name, str) or not 0 < len(name) <= 255:
            raise Refused(f"name {shown(name, 40)} is not a folder name")
        if unlabeled and "num-unlabeled" not in said:
            raise Refused("identity lacks num-unlabeled (the run pre-trains on the nodes)")
        return Identity(
            name=name,
            num_train=integer(said["num-train"], "num-train", 1, high),
            num_test=integer(said["num-test"], "num-test", 1, high),
            num_unlabeled=(
                integer(said["num-unlabeled"], "num-unlabeled", 1, high)
                if "num-unlabeled" in said
                else None
            ),
        )
    fields(said, ConfigRecord, "identity", ("partition-id",), ("num-partitions",))
    declared = (
        integer(said["num-partitions"], "num-partitions", 1) if "num-partitions" in said else None
    )
    if declared is not None and declared != num_clients:
        raise Refused(
            f"num-partitions {declared} is not the run's num-clients {num_clients} "
            "(under the Simulation Engine: num-supernodes)"
        )
    return Identity(
        partition=integer(said["partition-id"], "partition-id", 0, num_clients - 1),
        declared=declared,
    )


def answered(content: Any, *, client: int, like: np.ndarray, problem=None) -> np.ndarray:
    """A reply to the rule's first question: the node's client and one array of
    ``like``'s shape and dtype, finite, and nothing ``problem(answer)`` (the rule's own
    check, :meth:`cpcfl_tf.methods.rules.Rule.answer_problem`) finds wrong."""
    records(content, "metrics", "answer")
    _client(_metrics(content, ("client-id",)), client)
    (answer,) = arrays(content["answer"], [like], "answer")
    said = None if problem is None else problem(answer)
    if said is not None:
        raise Refused(f"answer: {said}")
    return answer


@dataclasses.dataclass(frozen=True)
class Trained:
    """A round's training reply."""

    client: int
    cluster: int
    count: int
    weights: list


def trained(
    content: Any,
    *,
    client: int,
    num_models: int,
    expected: int | None,
    most: int | None,
    models: Sequence[Sequence[np.ndarray]],
) -> Trained:
    """A training reply: the node's client, a cluster id inside the pool (``expected``
    where the server assigned the model or drew it for the Tc phase), an example count
    in 1..``most`` and the weights of that cluster's model."""
    records(content, "metrics", "model")
    metrics = _metrics(content, ("client-id", "cluster-id", "num-examples"))
    _client(metrics, client)
    cluster = integer(metrics["cluster-id"], "cluster-id", 0, num_models - 1)
    if expected is not None and cluster != expected:
        raise Refused(f"cluster-id {cluster} is not the model {expected} it was given to train")
    count = integer(metrics["num-examples"], "num-examples", 1, math.inf if most is None else most)
    return Trained(client, cluster, count, arrays(content["model"], models[cluster]))


@dataclasses.dataclass(frozen=True)
class Scored:
    """A scored round's reply: the node's accuracy on its own test data."""

    client: int
    accuracy: float
    count: int


def scored(content: Any, *, client: int, most: int | None) -> Scored:
    """A scoring reply: the node's client, an accuracy in [0, 1] and its test examples
    (1..``most``)."""
    records(content, "metrics")
    metrics = _metrics(content, ("accuracy", "num-examples", "client-id"))
    return Scored(
        _client(metrics, client),
        real(metrics["accuracy"], "accuracy", 0.0, 1.0),
        integer(metrics["num-examples"], "num-examples", 1, math.inf if most is None else most),
    )


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A federated pre-training round's reply: the online parts, the image count and the
    round's results (loss, embedding_std, steps, seconds; the method's own)."""

    client: int
    count: int
    weights: list
    results: dict


def pretrained(
    content: Any,
    *,
    client: int,
    most: int | None,
    like: Sequence[np.ndarray],
    batch_size: int,
    local_epochs: int,
    reported: Sequence[str] = (),
    timeout: float = math.inf,
) -> Pretrained:
    """A pre-training reply: the node's client, an image count in ``batch_size``..``most``,
    exactly the steps that count makes (``local_epochs`` passes of whole batches), a
    finite loss, a non-negative embedding_std, seconds within the round's ``timeout``,
    each ``reported`` value of the method in [0, 1] (FedEMA's mu), and the online parts
    of ``like``'s shapes."""
    records(content, "metrics", "model")
    metrics = _metrics(
        content,
        ("client-id", "num-examples", "steps", "loss", "embedding_std", "seconds"),
        reported,
    )
    _client(metrics, client)
    count = integer(
        metrics["num-examples"], "num-examples", batch_size, math.inf if most is None else most
    )
    steps = count // batch_size * local_epochs
    if integer(metrics["steps"], "steps", 0) != steps:
        raise Refused(f"steps {metrics['steps']} is not the {steps} that {count} images make")
    results = {
        "steps": steps,
        "loss": real(metrics["loss"], "loss"),
        "embedding_std": real(metrics["embedding_std"], "embedding_std", 0.0),
        "seconds": real(metrics["seconds"], "seconds", 0.0, timeout),
        **{k: real(metrics[k], k, 0.0, 1.0) for k in reported if k in metrics},
    }
    return Pretrained(client, count, arrays(content["model"], like), results)
