"""The ClientApp: one node = one client of the paper's protocol.

A node reads ``partition-id`` from its node config (``flower-supernode --node-config
"partition-id=0"``), keeps its own training and test images, and answers three
messages: ``query`` (which partition am I; and, once before training, what the method
asks first: the oracle its true group, PACFL its data subspace), ``train`` (select a
cluster on its *training* data, or take the one the server assigned, train it with the
simulator's local step, send weights + cluster id + number of examples) and
``evaluate`` (accuracy of its cluster's model on its *test* data). Images and labels
never leave the node.
"""
from __future__ import annotations

import functools

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from cpcfl_tf.flower.common import from_record, run_config, to_record

app = ClientApp()


def _checked(run_items: tuple, partition_id: int):
    """The run's config, once this node's partition id is known to be one of its clients."""
    config = run_config(dict(run_items))
    num_clients = config.partition.num_clients
    if not 0 <= partition_id < num_clients:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_clients - 1} "
                         "(run config num-clients)")
    return config


@functools.lru_cache(maxsize=1)
def _run(run_items: tuple):
    """The run's config, every client's data and a backend, built once per process and
    run: under the Simulation Engine one process serves many partitions of a run."""
    from cpcfl_tf.federated.backends import backend_of
    from cpcfl_tf.federated.clients import clients_for
    from cpcfl_tf.federated.simulator import build_template
    from cpcfl_tf.flower.common import run_config

    config = run_config(dict(run_items))
    fl = config.resolved().federated
    # Every node draws the seeded partition the simulator draws and keeps its own rows;
    # a deployment with data of its own replaces this with loading that data.
    clients = clients_for(config)
    template = build_template(fl, clients.train.images.shape[2:], clients.num_classes)
    return config, clients, backend_of(template, fl)


def _node(run_items: tuple, partition_id: int):
    """Config, this node's data, the backend and its true group."""
    _checked(run_items, partition_id)
    config, clients, backend = _run(run_items)
    own = np.array([partition_id])
    return (config, clients.train.subset(own), clients.test.subset(own), backend,
            int(clients.groups[partition_id]))


def _context(context: Context):
    return _node(tuple(sorted(context.run_config.items())),
                 int(context.node_config["partition-id"]))


def _reply(msg: Message, **records) -> Message:
    return Message(RecordDict(records), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """The partition id (the server's client roster). Every message runs in a fresh
    ClientApp process, so this one loads no data and no TensorFlow: train replies carry
    the number of examples the averaging weighs by."""
    partition_id = int(context.node_config["partition-id"])
    _checked(tuple(sorted(context.run_config.items())), partition_id)
    asked = msg.content["config"]["ask"] if "config" in msg.content else None
    if asked is None:
        declared = context.node_config.get("num-partitions")  # what the node was started for
        return _reply(msg, metrics=MetricRecord({
            "partition-id": partition_id,
            **({} if declared is None else {"num-partitions": int(declared)})}))
    # Once before training, what the method needs (Method.asks_first): only now data.
    _, data, _, _, group = _context(context)
    if asked == "group":
        return _reply(msg, metrics=MetricRecord({"partition-id": partition_id, "group": group}))
    from cpcfl_tf.federated import algorithm

    basis = int(msg.content["config"]["basis"])
    return _reply(msg, metrics=MetricRecord({"partition-id": partition_id}),
                  subspace=to_record([algorithm.data_subspace(data.images[0], basis)]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Select a cluster (the drawn one in the Tc phase), train it locally, send it back."""
    from cpcfl_tf.federated import algorithm
    from cpcfl_tf.federated.backends import (LocalTraining, batch_orders, client_losses,
                                             stack_models, unstack)

    config, data, _, backend, _ = _context(context)
    fl = config.resolved().federated
    settings = msg.content["config"]
    partition_id = int(context.node_config["partition-id"])
    # The round's plan, drawn from the seeds exactly as the server and the simulator draw it.
    plan = algorithm.plan_round(fl, config.seed, int(settings["attempt"]), int(settings["round"]),
                                config.partition.num_clients)
    row = int(np.searchsorted(plan.participants, partition_id))
    models = {int(k.split("-")[1]): from_record(r) for k, r in msg.content.array_records.items()}
    if "cluster" in settings:  # the server assigned this node its model
        cluster = int(settings["cluster"])
    else:
        losses = None
        if plan.drawn is None:  # Eq. cluster_identity on this client's own training data
            losses = np.zeros((len(plan.participants), fl.num_clusters))
            losses[row] = client_losses(backend, [models[n] for n in range(fl.num_clusters)],
                                        data)[0]
        cluster = int(algorithm.select(plan, losses)[row])
    orders = batch_orders(len(plan.participants), data.size, fl.local_epochs,
                          plan.batch_seed)[:, row:row + 1]
    trained = backend.train(stack_models([models[cluster]]), np.array([0]), data, orders,
                            algorithm.trains_encoder(fl, plan), LocalTraining.of(fl))
    return _reply(msg, model=to_record(unstack(trained, 0)), metrics=MetricRecord({
        "cluster-id": cluster, "num-examples": data.size, "partition-id": partition_id}))


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Accuracy of the received cluster model on this node's local test data."""
    from cpcfl_tf.federated.backends import client_probabilities
    from cpcfl_tf.federated.metrics import client_accuracy

    _, _, test, backend, _ = _context(context)
    model = from_record(msg.content.array_records["model"])
    probs = client_probabilities(backend, [model], np.array([0]), test)
    return _reply(msg, metrics=MetricRecord({
        "accuracy": float(client_accuracy(test.labels, probs)[0]), "num-examples": test.size,
        "partition-id": int(context.node_config["partition-id"])}))

