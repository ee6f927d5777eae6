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
import json
import time

import numpy as np

from cpcfl_tf.config import Config
from cpcfl_tf.data.sources import LabeledImages
from cpcfl_tf.errors import UserError
from cpcfl_tf.federated.backends import (LocalTraining, batch_orders, client_probabilities,
                                         make_backend, stack_models, unstack)
from cpcfl_tf.federated.metrics import client_accuracy, pooled_scores
from cpcfl_tf.federated.clients import ClientArrays, Clients
from cpcfl_tf.federated.simulator import build_template, initial_pool


def _train_pooled(config: Config, data: ClientArrays, encoder_weights, num_classes: int,
                  epochs: int, seed: int):
    """Train one model per row of ``data`` (each row a pooled dataset), all at once."""
    fl = dataclasses.replace(config.federated.resolved(), num_clusters=data.num_clients)
    template = build_template(fl, data.images.shape[2:], num_classes)
    backend = make_backend(template, fl.backend)
    start = stack_models(initial_pool(fl, template, encoder_weights, seed=seed, attempt=0))
    orders = batch_orders(data.num_clients, data.size, epochs, [seed, 7])
    trained = backend.train(start, np.arange(data.num_clients), data, orders, [True] * epochs,
                            LocalTraining.of(fl))
    return backend, [unstack(trained, k) for k in range(data.num_clients)]


def centralized_baseline(config: Config, clients: Clients, encoder_weights=None, *,
                         by_group: bool, seed: int | None = None) -> dict:
    """Accuracy (mean over clients' local test sets), F1 and AUROC of a centralized model.

    Returns the ``final`` part of a run record plus ``epochs``.
    """
    seed = config.seed if seed is None else seed
    fl = config.federated
    epochs = fl.centralized_epochs or fl.rounds * fl.local_epochs
    groups = np.unique(clients.groups) if by_group else np.array([0])
    member = clients.groups if by_group else np.zeros(clients.train.num_clients, np.int64)
    rows = [np.flatnonzero(member == g) for g in groups]
    if len({len(r) for r in rows}) != 1:
        raise ValueError("the by-group baseline needs groups of equal size")
    pooled = ClientArrays(
        np.stack([clients.train.images[r].reshape(-1, *clients.train.images.shape[2:]) for r in rows]),
        np.stack([clients.train.labels[r].reshape(-1) for r in rows]))
    backend, models = _train_pooled(config, pooled, encoder_weights, clients.num_classes,
                                    epochs, seed)
    probs = client_probabilities(backend, models, np.searchsorted(groups, member), clients.test)
    return {"accuracy": float(client_accuracy(clients.test.labels, probs).mean()),
            **pooled_scores(clients.test.labels, probs), "epochs": epochs}


def run_centralized(config: Config, clients: Clients, encoder_weights=None) -> dict:
    """A centralized baseline as a run record (the contract's fields, no rounds).

    ``federated.num_clusters`` says which: 1 pools all clients, the number of true groups
    pools them by group (tab:different_datasets' two centralized rows).
    """
    groups = len(np.unique(clients.groups))
    n = config.federated.num_clusters
    if n not in (1, groups):
        raise UserError(f"a centralized run takes federated.num_clusters 1 (all clients pooled) "
                        f"or {groups} (pooled by true group), got {n}")
    started = time.perf_counter()
    final = centralized_baseline(config, clients, encoder_weights, by_group=n > 1)
    final.update(ari=None, restarts=0, bytes_down=0, bytes_up=0)
    seconds = time.perf_counter() - started
    return {"config": dataclasses.asdict(config),
            "seeds": {"data": config.seed, "train": config.seed}, "clients": clients.records,
            "rounds": [], "final": final,
            "timing": {"seconds": seconds, "seconds_per_round": None}}


def supervised_encoder(config: Config, labeled: LabeledImages, *, epochs: int,
                       seed: int | None = None) -> list[np.ndarray]:
    """Encoder weights from supervised pre-training: encoder + theta_c trained with labels
    on ``labeled`` (the paper: CIFAR-100), then the head is dropped."""
    seed = config.seed if seed is None else seed
    data = ClientArrays(labeled.images[None], labeled.labels[None])
    backend, (model,) = _train_pooled(config, data, None, labeled.num_classes, epochs, seed)
    return model[:backend.num_encoder]


def pretrained_supervised(config: Config, *, seed: int = 0, verbose: int = 1
                          ) -> list[np.ndarray]:
    """Supervised pre-training on the *labeled* version of ``config.data``'s pre-training
    split (tab:encoder_pretraining), cached like the contrastive encoders.

    It gets the contrastive pre-training's budget: ``config.pretrain``'s epochs, batch
    size and learning rate (the paper does not give its own).
    """
    from cpcfl_tf.contrastive.pretrain import cache_root, pretrain_key
    from cpcfl_tf.data import load_labeled
    from cpcfl_tf.results import read_cache_entry, write_atomic

    data, pre = config.data, config.pretrain
    source = {"dataset": data.pretrain_dataset, "split": data.pretrain_split,
              "image_size": data.image_size}
    out = cache_root() / "pretrained" / pretrain_key(pre, name="supervised", data=source,
                                                     seed=seed)
    path = out / "encoder.npz"
    if path.exists():
        def load(p):
            with np.load(p) as stored:
                return [stored[f"w{i}"] for i in range(len(stored.files))]

        cached = read_cache_entry(path, load, rebuild="pre-training it again")
        if cached is not None:
            return cached
    if verbose:
        print(f"supervised pre-training ({pre.encoder}) on {data.pretrain_dataset}:"
              f"{data.pretrain_split} with its labels -> {out}", flush=True)
    labeled = load_labeled(data.pretrain_dataset, data.pretrain_split,
                           image_size=data.image_size, data_dir=data.data_dir,
                           manual_dir=data.manual_dir)
    budget = config.with_overrides(federated={"batch_size": pre.batch_size,
                                              "learning_rate": pre.learning_rate})
    weights = supervised_encoder(budget, labeled, epochs=pre.epochs, seed=seed)
    out.mkdir(parents=True, exist_ok=True)

    def save(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **{f"w{i}": w for i, w in enumerate(weights)})

    write_atomic(path, save)
    (out / "source.json").write_text(json.dumps({"config": dataclasses.asdict(pre), **source,
                                                 "seed": seed}, indent=2))
    return weights
