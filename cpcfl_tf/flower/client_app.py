"""The ClientApp: one node = one client of the paper's protocol.

A node holds its client's data in one of two ways, set by its node config:

- ``partition-id=K`` (simulations and rehearsals): the node draws the run's seeded
  partition, as the simulator does, and keeps client K's rows;
- ``data-path=DIR`` (a deployment): the node reads its own image folder (one subfolder
  per class, optional ``train/`` and ``test/``; :func:`cpcfl_tf.data.folders.list_node_folder`),
  and no global dataset exists anywhere.

It answers three messages: ``query`` (who am I: the partition id, or the folder's name
and example counts; and, once before training, what the method asks first: the oracle
its true group, PACFL its data subspace), ``train`` (select a cluster on its *training*
data, or take the one the server assigned, train it with the simulator's local step,
send weights + cluster id + number of examples) and ``evaluate`` (in the scored rounds:
accuracy of its cluster's model on its *test* data). Images and labels never leave the
node. Bad data of its own (a missing folder, no images, a class the run does not know, an
unreadable image) is one line in the node's log and an error reply, which the server
handles as it handles a node that died.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from cpcfl_tf.data.folders import (
    list_node_folder,
    list_node_unlabeled,
    read_node_folder,
    read_node_unlabeled,
)
from cpcfl_tf.data.unlabeled import SMALLER_BATCH, check_batch
from cpcfl_tf.errors import UserError
from cpcfl_tf.flower import checks
from cpcfl_tf.flower.common import (
    class_names,
    from_record,
    models_from_records,
    run_config,
    to_record,
)
from cpcfl_tf.plan.resolve import resolve

app = ClientApp()


def _checked(run_items: tuple, partition_id: int):
    """The run's config, once this node's partition id is known to be one of its clients."""
    config = _plan(run_items).requested
    num_clients = config.partition.num_clients
    if not 0 <= partition_id < num_clients:
        raise UserError(
            f"partition-id {partition_id} is outside 0..{num_clients - 1} (run config num-clients)"
        )
    return config


@functools.lru_cache(maxsize=1)
def _plan(run_items: tuple):
    """The run's plan, resolved once per process and run."""
    return resolve(run_config(dict(run_items)))


@functools.lru_cache(maxsize=1)
def _backend(run_items: tuple):
    """The run's plan and a backend, built once per process and run: under the
    Simulation Engine one process serves many partitions of a run."""
    from cpcfl_tf.clustered.backends import backend_of
    from cpcfl_tf.clustered.pool import build_template

    run = _plan(run_items)
    size = run.config.data.image_size
    template = build_template(run, (size, size, 3), len(class_names(dict(run_items))))
    _template_weights[run_items] = template.get_weights()
    _num_encoder[run_items] = len(template.get_layer("encoder").weights)
    return run, backend_of(template, run.federated)


_template_weights: dict[tuple, list] = {}
"""The run's model as the node builds it (what every model it is sent must match)."""
_num_encoder: dict[tuple, int] = {}
"""How many of the model's arrays are its encoder's."""


def _models(msg: Message, run_items: tuple) -> dict[int, list[np.ndarray]]:
    """The cluster models of a server's message, each checked against the node's own
    template: a model of other shapes, dtypes or with non-finite values is refused (an
    error reply) instead of trained or scored."""
    models = models_from_records(msg.content.array_records)
    like = _template_weights[run_items]
    shared = [like[i] for i in _shared(run_items)]  # a personalized method's: no kept part
    for n, weights in sorted(models.items()):
        problem = checks.weights_problem(weights, shared)
        if problem is not None:
            raise UserError(f"the server sent model {n} with {problem}")
    return models


@functools.lru_cache(maxsize=1)
def _shared(run_items: tuple) -> list[int]:
    """The arrays of the model that go over the wire: all but a personalized method's
    kept part (:func:`~cpcfl_tf.clustered.algorithm.sent_arrays`), once per run."""
    from cpcfl_tf.clustered.algorithm import sent_arrays

    return sent_arrays(_plan(run_items), _num_encoder[run_items], len(_template_weights[run_items]))


@functools.lru_cache(maxsize=1)
def _kept(run_items: tuple) -> tuple[int, ...]:
    """The arrays a node keeps (:func:`~cpcfl_tf.clustered.algorithm.kept_arrays`), once
    per run."""
    from cpcfl_tf.clustered.algorithm import kept_arrays

    return kept_arrays(_plan(run_items), _num_encoder[run_items], len(_template_weights[run_items]))


_PART = "personal-part"
"""Where a node keeps its personalized method's part between rounds
(:attr:`~cpcfl_tf.methods.federated.Method.keeps`: FedPer's and FedRep's head,
LG-FedAvg's encoder, Ditto's personal model), never sent."""


def _own_model(
    msg: Message, context: Context, run_items: tuple, sent: list[np.ndarray]
) -> list[np.ndarray]:
    """This node's own model: the shared arrays the server ``sent`` with the node's kept
    part in its place (the simulator's :meth:`~cpcfl_tf.clustered.local.ClientParts.model`;
    Ditto's part is the whole personal model). A node without a part yet takes the one
    every client starts from, the initial pool's, which the server sends it (``part``)
    until the node has answered a training message."""
    like, index = _template_weights[run_items], _kept(run_items)
    kept = context.state.array_records.get(_PART)
    if kept is not None:
        part = from_record(kept)
    elif "part" in msg.content:
        part = from_record(msg.content["part"])
        problem = checks.weights_problem(part, [like[i] for i in index])
        if problem is not None:
            raise UserError(f"the server sent a starting part with {problem}")
    else:
        raise UserError(
            "the server sent no starting part and this node holds none (its state was "
            "lost): start the run again"
        )
    own: list = [None] * len(like)
    for i, a in zip(_shared(run_items), sent):
        own[i] = a
    for i, a in zip(index, part):
        own[i] = a
    return own


def _keep(context: Context, run_items: tuple, own: list[np.ndarray]) -> None:
    """Keep ``own``'s kept part in the node's state for the next round."""
    context.state[_PART] = to_record([own[i] for i in _kept(run_items)])


@functools.lru_cache(maxsize=1)
def _partition(run_items: tuple):
    """Every client of the run's seeded partition (what the simulator draws), once per
    process and run."""
    from cpcfl_tf.clustered.clients import clients_for

    return clients_for(_plan(run_items).requested)


def _listing(run_items: tuple, path: str) -> dict:
    """The node folder's files, checked (no image read, no TensorFlow)."""
    return list_node_folder(path, class_names(dict(run_items)))


@functools.lru_cache(maxsize=1)
def _dealt(run_items: tuple) -> list:
    """Every client's unlabeled images under the run's deal (what the simulator deals),
    once per process and run."""
    from cpcfl_tf.clustered.clients import unlabeled_for

    return unlabeled_for(_plan(run_items).requested)


@functools.lru_cache(maxsize=4)
def _own_unlabeled(run_items: tuple, path: str) -> np.ndarray:
    """This node's own unlabeled images (``data-path``/unlabeled/)."""
    config = _plan(run_items).requested
    return read_node_unlabeled(list_node_unlabeled(path), config.data.image_size)


@functools.lru_cache(maxsize=1)
def _trainer(run_items: tuple, shape: tuple):
    """The federated pre-training's client side, built once per process and run."""
    from cpcfl_tf.pretraining.federated_pretrain import LocalTrainer

    return LocalTrainer(_plan(run_items).pretraining, shape)


@functools.lru_cache(maxsize=4)
def _own(run_items: tuple, path: str):
    """This node's own images as one client's arrays: (train, test)."""
    from cpcfl_tf.clustered.clients import ClientArrays

    config = _plan(run_items).requested
    data = read_node_folder(
        _listing(run_items, path), len(class_names(dict(run_items))), config.data.image_size
    )
    return tuple(
        ClientArrays(data[s].images[None], data[s].labels[None]) for s in ("train", "test")
    )


def _node(context: Context):
    """The run's plan, this node's (train, test) data, the backend and its true group
    (``None`` when the node brought its own data and no ``group`` in its node config)."""
    run_items = tuple(sorted(context.run_config.items()))
    run, backend = _backend(run_items)
    path = context.node_config.get("data-path")
    if path is not None:
        train, test = _own(run_items, str(path))
        group = context.node_config.get("group")
        return run, train, test, backend, None if group is None else int(group)
    partition_id = _int(context.node_config["partition-id"])
    _checked(run_items, partition_id)
    clients = _partition(run_items)
    own = np.array([partition_id])
    return (
        run,
        clients.train.subset(own),
        clients.test.subset(own),
        backend,
        int(clients.groups[partition_id]),
    )


def _addressed(settings, context: Context) -> None:
    """Refuse a message meant for another client: the server names the client (its id,
    and for a node with its own data the folder name) and the node checks it against
    its own node config, so a message that reached the wrong node fails loudly instead
    of training or scoring one client's model on another's data."""
    client = _int(settings["client-id"])
    path = context.node_config.get("data-path")
    mine: str | int
    meant: object
    if path is not None:
        mine, meant = Path(str(path)).name, settings.get("name")
        wrong = meant is not None and str(meant) != mine
    else:
        mine, meant = _int(context.node_config["partition-id"]), client
        wrong = meant != mine
    if wrong:
        raise UserError(
            f"a message for client {client} ({meant}) reached the node of "
            f"{mine}: the SuperLink delivered it to the wrong node"
        )


def _int(value: object) -> int:
    """An integer a message or the node config carries (a Flower record value)."""
    if not isinstance(value, int | float | str):
        raise UserError(f"expected an integer, got a {type(value).__name__}")
    return int(value)


def _reply(msg: Message, **records) -> Message:
    return Message(RecordDict(records), reply_to=msg)


def _refusing(handler):
    """Bad input of this node's (its data, its node config) becomes one line in the
    node's log and an error reply, not a traceback: the server leaves the node out."""

    @functools.wraps(handler)
    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except UserError as err:
            print(
                f"[cpcfl] node refused {msg.metadata.message_type}: {err}",
                file=sys.stderr,
                flush=True,
            )
            return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, str(err)), reply_to=msg)

    return wrapped


def _identity(context: Context) -> dict:
    """Who this node is, as the roster query reports it: its partition id, or its data
    folder's name and example counts (checked by listing the folder, nothing loaded)."""
    run_items = tuple(sorted(context.run_config.items()))
    path = context.node_config.get("data-path")
    if path is not None:
        listed = _listing(run_items, str(path))
        unlabeled = {}
        pretraining = _plan(run_items).pretraining
        on_clients = None if pretraining is None else pretraining.federated
        if on_clients is not None:  # a federated pre-training needs a batch of them: refused
            found = list_node_unlabeled(str(path))  # now, if fewer
            check_batch(
                len(found),
                on_clients.settings["batch_size"],
                f"{path}/unlabeled holds",
                "add images or " + SMALLER_BATCH,
            )
            unlabeled = {"num-unlabeled": len(found)}
        return {
            "name": Path(str(path)).name,
            "num-train": len(listed["train"]),
            "num-test": len(listed["test"]),
            **unlabeled,
        }
    if "partition-id" not in context.node_config:
        raise UserError(
            "the node config has neither partition-id nor data-path; start the "
            "SuperNode with --node-config 'data-path=\"DIR\"' (its own images) "
            'or "partition-id=K num-partitions=N"'
        )
    partition_id = _int(context.node_config["partition-id"])
    _checked(run_items, partition_id)
    declared = context.node_config.get("num-partitions")  # what the node was started for
    return {
        "partition-id": partition_id,
        **({} if declared is None else {"num-partitions": int(declared)}),
    }


@app.query()
@_refusing
def query(msg: Message, context: Context) -> Message:
    """Who this node is (the server's client roster). Every message runs in a fresh
    ClientApp process, so this one loads no data and no TensorFlow."""
    settings: Mapping[str, object] = msg.content["config"] if "config" in msg.content else {}
    asked = settings.get("ask")
    if asked is None:  # a ConfigRecord: a folder name is a string
        return _reply(msg, identity=ConfigRecord(_identity(context)))
    # Once before training, what the method's rule asks (cpcfl_tf.methods.rules): only now data.
    client = _int(settings["client-id"])
    _addressed(settings, context)
    run, data, _, _, group = _node(context)
    answer = run.rule.answer(dict(settings), data.images[0], group)
    return _reply(msg, metrics=MetricRecord({"client-id": client}), answer=to_record([answer]))


def _pretrain(msg: Message, context: Context) -> Message:
    """One round of the federated pre-training on this node's unlabeled images: the
    simulator's client round (:class:`~cpcfl_tf.pretraining.federated_pretrain.LocalTrainer`),
    what the client keeps (BYOL's target, FedEMA's previous weights) in the node's
    ``context.state``; sends its online parts and its image count."""
    from flwr.app import Array, ArrayRecord

    from cpcfl_tf.pretraining.fedavg_ssl import ClientState

    settings = msg.content["config"]
    client = _int(settings["client-id"])
    _addressed(settings, context)
    run_items = tuple(sorted(context.run_config.items()))
    path = context.node_config.get("data-path")
    images = (
        _own_unlabeled(run_items, str(path))
        if path is not None
        else _dealt(run_items)[_int(context.node_config["partition-id"])]
    )
    trainer = _trainer(run_items, tuple(images.shape[1:]))
    problem = checks.weights_problem(from_record(msg.content["model"]), trainer.initial())
    if problem is not None:
        raise UserError(f"the server sent online parts with {problem}")
    kept = context.state.array_records.get(_KEPT)
    state = ClientState.from_arrays({} if kept is None else {k: a.numpy() for k, a in kept.items()})
    sent, result = trainer.round(
        from_record(msg.content["model"]), state, images, _int(settings["round"]), client
    )
    context.state[_KEPT] = ArrayRecord(
        array_dict={k: Array.from_numpy_ndarray(np.asarray(a)) for k, a in state.arrays().items()}
    )
    return _reply(
        msg,
        model=to_record(sent),
        metrics=MetricRecord(
            {
                "client-id": client,
                "num-examples": len(images),
                "steps": result["steps"],
                **{
                    k: float(result[k])
                    for k in ("loss", "embedding_std", "seconds", *trainer.algorithm.reported)
                    if k in result
                },
            }
        ),
    )


_KEPT = "pretrain-kept"
"""Where a node keeps its federated pre-training's state between rounds."""


@app.train()
@_refusing
def train(msg: Message, context: Context) -> Message:
    """Select a cluster (the drawn one in the Tc phase), train it locally, send it back;
    in the federated pre-training stage, train the self-supervised model instead."""
    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.clustered.backends import client_losses
    from cpcfl_tf.clustered.local import batch_orders

    settings = msg.content["config"]
    if settings.get("stage") == "pretrain":
        return _pretrain(msg, context)
    client, num_clients = _int(settings["client-id"]), _int(settings["num-clients"])
    _addressed(settings, context)
    run, data, _, backend, _ = _node(context)
    fl = run.federated
    # The round's plan, drawn from the seeds exactly as the server and the simulator draw it.
    plan = algorithm.plan_round(
        run, run.config.seed, _int(settings["attempt"]), _int(settings["round"]), num_clients
    )
    row = int(np.searchsorted(plan.participants, client))
    models = _models(msg, tuple(sorted(context.run_config.items())))
    if "cluster" in settings:  # the server assigned this node its model
        cluster = _int(settings["cluster"])
        if cluster not in models:
            raise UserError(f"the server assigned model {cluster} but sent {sorted(models)}")
    else:
        losses = None
        if sorted(models) != list(range(fl.num_clusters)):
            raise UserError(
                f"the server sent models {sorted(models)}, not the pool of {fl.num_clusters}"
            )
        if plan.drawn is None:  # Eq. cluster_identity on this client's own training data
            losses = np.zeros((len(plan.participants), fl.num_clusters))
            if fl.num_clusters > 1:  # one model: nothing to choose
                pool = [models[n] for n in range(fl.num_clusters)]
                losses[row] = client_losses(backend, pool, data)[0]
        cluster = int(algorithm.select(plan, losses)[row])
    orders = batch_orders(len(plan.participants), data.size, fl.local_epochs, plan.batch_seed)[
        :, row : row + 1
    ]
    weights = _trained_here(msg, context, run, backend, models[cluster], data, orders, plan)
    weights, metrics = _tampered(
        context,
        _int(settings["round"]) + 1,
        weights,
        {"cluster-id": cluster, "num-examples": data.size, "client-id": client},
        fl.num_clusters,
    )
    return _reply(msg, model=to_record(weights), metrics=MetricRecord(metrics))


def _trained_here(msg, context, run, backend, model, data, orders, plan) -> list[np.ndarray]:
    """The node's local training of ``model`` (the simulator's step for one client) and
    what it sends: the trained model, or for a method that keeps a part
    (:attr:`~cpcfl_tf.methods.federated.Method.keeps`) its shared arrays, the part kept in
    the node's ``context.state``. FedPer, FedRep and LG-FedAvg train the node's own model
    (the shared arrays with its part); Ditto trains the shared model, which it sends, and
    its personal model towards it (``prox = lambda``)."""
    import dataclasses

    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.clustered.local import LocalTraining, stack_models, unstack

    fl, keeps = run.federated, run.method.keeps
    run_items = tuple(sorted(context.run_config.items()))
    local, parts = LocalTraining.of(fl), algorithm.epoch_parts(fl, plan)

    def trained(start, how, anchor=None):
        return unstack(
            backend.train(
                stack_models([start]), np.array([0]), data, orders, parts, how, None, anchor
            ),
            0,
        )

    if keeps and keeps != "model":
        own = trained(_own_model(msg, context, run_items, model), local)
        _keep(context, run_items, own)
        return [own[i] for i in _shared(run_items)]
    weights = trained(model, local)
    if keeps == "model":
        personal = dataclasses.replace(local, prox=float((fl.options or {})["lambda"]))
        _keep(
            context, run_items, trained(_own_model(msg, context, run_items, model), personal, model)
        )
    return weights


TAMPERS = {
    "nan-weights": lambda w, m, n: ([np.full_like(w[0], np.nan), *w[1:]], m),
    "wrong-shape": lambda w, m, n: ([w[0][..., :-1], *w[1:]], m),
    "negative-count": lambda w, m, n: (w, {**m, "num-examples": -5}),
    "huge-count": lambda w, m, n: (w, {**m, "num-examples": 10**9}),
    "foreign-cluster": lambda w, m, n: (w, {**m, "cluster-id": n}),
    "huge-weights": lambda w, m, n: ([np.full_like(a, 1e30) for a in w], m),
}
"""What a node started with node config ``tamper="NAME"`` does to its training replies
(every round, or round ``tamper-round`` only): an untrusted node, to rehearse the
server's checks (docs/flower.md, "What is and is not secured"). Each but
``huge-weights`` gets its reply left out of the round by the server; ``huge-weights``
(every weight 1e30: finite, of the right shapes) counts, and only a robust
``federated.aggregation`` or ``federated.update_norm`` limits what it does."""


def _tampered(context: Context, round_: int, weights: list, metrics: dict, num_models: int):
    """The reply a tampering node sends instead (:data:`TAMPERS`); unchanged otherwise."""
    name = context.node_config.get("tamper")
    if name is None or int(context.node_config.get("tamper-round", round_)) != round_:
        return weights, metrics
    if name not in TAMPERS:
        raise UserError(f"node config tamper={name!r} is not one of {', '.join(TAMPERS)}")
    print(
        f"[cpcfl] node tampers with its round-{round_} reply: {name}", file=sys.stderr, flush=True
    )
    return TAMPERS[name](weights, metrics, num_models)


@app.evaluate()
@_refusing
def evaluate(msg: Message, context: Context) -> Message:
    """Accuracy of the received cluster model on this node's local test data. Sent the
    whole pool (the node has not taken part yet), the node scores the model of lowest
    loss on its training data, as it would choose it."""
    from cpcfl_tf.clustered.backends import client_losses, client_probabilities
    from cpcfl_tf.clustered.metrics import client_accuracy

    settings = msg.content["config"]
    _addressed(settings, context)
    run, data, test, backend, _ = _node(context)
    run_items = tuple(sorted(context.run_config.items()))
    sent = _models(msg, run_items)
    pool = [sent[n] for n in sorted(sent)]  # by cluster id: ties go as the simulator's
    model = pool[0] if len(pool) == 1 else pool[client_losses(backend, pool, data)[0].argmin()]
    if run.method.keeps:  # scored with its own model (Ditto: its personal model)
        model = _own_model(msg, context, run_items, model)
    if run.method.fine_tunes:  # scored after it fine-tunes a copy of the model
        model = _fine_tuned(run, backend, model, data, settings)
    probs = client_probabilities(backend, [model], np.array([0]), test)
    return _reply(
        msg,
        metrics=MetricRecord(
            {
                "accuracy": float(client_accuracy(test.labels, probs)[0]),
                "num-examples": test.size,
                "client-id": _int(msg.content["config"]["client-id"]),
            }
        ),
    )


def _fine_tuned(run, backend, model, data, settings) -> list[np.ndarray]:
    """``model`` after ``finetune_epochs`` local epochs of the whole model on this node's
    training data: the simulator's fine-tuning of this client (fresh optimizer state, the
    batch order of the round's :attr:`~cpcfl_tf.clustered.algorithm.Stream.FINE_TUNE`
    stream, its row the client's)."""
    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.clustered.local import MODEL, LocalTraining, batch_orders, stack_models, unstack

    fl = run.federated
    epochs = int((fl.options or {})["finetune_epochs"])
    client, num_clients = _int(settings["client-id"]), _int(settings["num-clients"])
    seed = algorithm.stream_seed(
        run.config.seed,
        _int(settings["attempt"]),
        _int(settings["round"]),
        algorithm.Stream.FINE_TUNE,
    )
    orders = batch_orders(num_clients, data.size, epochs, seed)[:, client : client + 1]
    tuned = backend.train(
        stack_models([model]), np.array([0]), data, orders, [MODEL] * epochs, LocalTraining.of(fl)
    )
    return unstack(tuned, 0)
