"""Centralized baselines (tab:different_datasets) and supervised pre-training
(tab:encoder_pretraining), trained by the same backends as the clients.

* ``pooled``: every client's training data in one set, one model; scored on every
  client's local test set.
* ``by group``: the clients' data pooled by their *true* group, one model per group (the
  paper's upper bound); each client is scored with its group's model.

Both train the whole model (encoder + head) from the run's starting encoder, with the
clients' optimiser settings, for ``federated.centralized_epochs`` epochs (default
rounds x local epochs: as many passes over each example as a client makes).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from cpcfl_tf.clustered.backends import backend_of, client_probabilities
from cpcfl_tf.clustered.clients import ClientArrays, Clients
from cpcfl_tf.clustered.local import MODEL, LocalTraining, batch_orders, stack_models, unstack
from cpcfl_tf.clustered.metrics import client_accuracy, pooled_scores
from cpcfl_tf.clustered.pool import initial_pool, template_for
from cpcfl_tf.data.specs import LabeledImages
from cpcfl_tf.errors import UserError
from cpcfl_tf.plan.resolve import RunPlan
from cpcfl_tf.records.record import SCORES, Final, RunRecord


def _train_pooled(
    run: RunPlan, data: ClientArrays, encoder_weights, num_classes: int, epochs: int, seed: int
):
    """Train one model per row of ``data`` (each row a pooled dataset), all at once: the
    run's models, one per row."""
    fl = dataclasses.replace(run.federated, num_clusters=data.num_clients)
    rows = dataclasses.replace(run, config=dataclasses.replace(run.config, federated=fl))
    template = template_for(rows, data.images.shape[2:], num_classes)
    backend = backend_of(template, fl)
    start = stack_models(initial_pool(rows, template, encoder_weights, seed=seed, attempt=0))
    orders = batch_orders(data.num_clients, data.size, epochs, [seed, 7])
    trained = backend.train(
        start, np.arange(data.num_clients), data, orders, [MODEL] * epochs, LocalTraining.of(fl)
    )
    return backend, [unstack(trained, k) for k in range(data.num_clients)]


def centralized_baseline(
    run: RunPlan,
    clients: Clients,
    encoder_weights=None,
    *,
    by_group: bool,
    seed: int | None = None,
) -> dict:
    """Accuracy (mean over clients' local test sets), F1 and AUROC of a centralized model.

    Returns the ``final`` part of a run record plus ``epochs``.
    """
    seed = run.config.seed if seed is None else seed
    fl = run.federated
    epochs = fl.centralized_epochs or fl.rounds * fl.local_epochs
    groups = np.unique(clients.groups) if by_group else np.array([0])
    member = clients.groups if by_group else np.zeros(clients.train.num_clients, np.int64)
    rows = [np.flatnonzero(member == g) for g in groups]
    if len({len(r) for r in rows}) != 1:
        raise ValueError("the by-group baseline needs groups of equal size")
    pooled = ClientArrays(
        np.stack(
            [clients.train.images[r].reshape(-1, *clients.train.images.shape[2:]) for r in rows]
        ),
        np.stack([clients.train.labels[r].reshape(-1) for r in rows]),
    )
    backend, models = _train_pooled(run, pooled, encoder_weights, clients.num_classes, epochs, seed)
    probs = client_probabilities(backend, models, np.searchsorted(groups, member), clients.test)
    return {
        "accuracy": float(client_accuracy(clients.test.labels, probs).mean()),
        **pooled_scores(clients.test.labels, probs),
        "epochs": epochs,
    }


def run_centralized(run: RunPlan, clients: Clients, encoder_weights=None) -> RunRecord:
    """A centralized baseline as a run record (no rounds, no clusters): the record keeps
    the config as requested (a baseline has no N or Tc to resolve).

    ``federated.num_clusters`` says which: 1 pools all clients, the number of true groups
    pools them by group (tab:different_datasets' two centralized rows).
    """
    config = run.requested
    groups = len(np.unique(clients.groups))
    n = config.federated.num_clusters
    if n not in (1, groups):
        raise UserError(
            f"a centralized run takes federated.num_clusters 1 (all clients pooled) "
            f"or {groups} (pooled by true group), got {n}"
        )
    started = time.perf_counter()
    result = centralized_baseline(run, clients, encoder_weights, by_group=n > 1)
    seconds = time.perf_counter() - started
    final = Final(result["accuracy"], {k: result[k] for k in SCORES}, epochs=result["epochs"])
    return RunRecord(
        config,
        config,
        {"data": config.seed, "train": config.seed},
        clients.records,
        [],
        final,
        {"seconds": seconds, "seconds_per_round": None},
    )


def supervised_encoder(
    run: RunPlan, labeled: LabeledImages, *, epochs: int, seed: int | None = None
) -> list[np.ndarray]:
    """Encoder weights from supervised pre-training: encoder + theta_c trained with labels
    on ``labeled`` (the paper: CIFAR-100), then the head is dropped. ``run``'s federated
    settings (batch, learning rate, head) are the training's."""
    seed = run.config.seed if seed is None else seed
    data = ClientArrays(labeled.images[None], labeled.labels[None])
    backend, (model,) = _train_pooled(run, data, None, labeled.num_classes, epochs, seed)
    return model[: backend.num_encoder]
