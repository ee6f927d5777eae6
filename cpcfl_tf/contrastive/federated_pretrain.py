"""Federated self-supervised pre-training: the encoder learned on the clients' unlabeled
images (``partition.unlabeled`` ``iid`` or ``groups``) when no server holds any.

One start (``fed-simclr``, ``fedema-byol``, ...: :data:`cpcfl_tf.ssl_methods.FEDERATED_STARTS`)
names a federated pre-training (its stages: :mod:`~cpcfl_tf.contrastive.fedavg_ssl`,
:mod:`~cpcfl_tf.contrastive.fedema`) and the self-supervised method whose own compiled
training step the clients run. The method's model is built once; each sampled client's
round swaps weights into it, resets the optimizer to its freshly built state (a fresh
Adam per client and round, as EasyFL's clients make one) and runs E_p local epochs of full
batches over its images in a seeded order (the last partial batch of an epoch is left out,
a different one every epoch). The server sees the uploaded online parts and image counts
only. Every round is checkpointed, so an interrupted pre-training resumes bit for bit.

The cache folder (``pretrained/<start>-<encoder>-<hash>/``) is laid out like the server's
(:mod:`cpcfl_tf.contrastive.pretrain`): ``encoder.keras`` (the global online encoder) and
``pretrain.json``, whose ``federated`` block says how it was made: rounds, local epochs,
participation, batch, the deal and each client's image count, bytes sent each way and the
clients' compute (steps, images, seconds).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import time
from pathlib import Path
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from cpcfl_tf.compat import pretrain_settings, without_added
from cpcfl_tf.config import Config
from cpcfl_tf.contrastive.fedavg_ssl import ClientState, get_parts, set_parts
from cpcfl_tf.contrastive.pretrain import (PretrainResult, _finished, build_contrastive_model,
                                           image_source)
from cpcfl_tf.errors import DivergedError, UserError
from cpcfl_tf.results import (CACHE_FIX, cache_root, prepare_out_dir, read_cache_entry,
                              write_atomic, write_json)
from cpcfl_tf.ssl_methods import FEDERATED_STARTS


def plan(config: Config) -> dict:
    """The federated pre-training ``config`` starts from, resolved: its name, method,
    settings (rounds resolved) and deal."""
    start = config.federated.pretraining
    algorithm, method = FEDERATED_STARTS[start]
    settings = algorithm.resolve((config.pretrain.options or {}).get(algorithm.name))
    passes = settings["local_epochs"] * settings["participation"]
    rounds = settings["rounds"] or max(1, round(config.pretrain.epochs / passes))
    return {"start": start, "algorithm": algorithm.name, "method": method,
            "settings": {**settings, "rounds": rounds}, "deal": config.partition.unlabeled}


def identity(config: Config) -> dict:
    """What a federated pre-training is, as its cache key and summary name it: the start,
    the method's settings in the server's layout, the federated settings, the deal, the
    partition it deals over (the ``groups`` deal follows the clients' labeled classes) and
    the clients' data."""
    p = plan(config)
    partition = without_added({"partition": dataclasses.asdict(config.partition)})["partition"]
    return json.loads(json.dumps({"method": p["start"],
            **pretrain_settings(dataclasses.asdict(config.pretrain), p["method"]),
            "federated": p["settings"], "partition": {**partition, "unlabeled": p["deal"]},
            "clients": {"dataset": config.data.client_dataset,
                        "split": config.data.client_train_split,
                        "partition_seed": config.seed}}))  # as JSON reads it back


def federated_folder(config: Config) -> Path:
    """The cache folder of ``config``'s federated pre-training (its pre-training seed)."""
    text = json.dumps({"config": identity(config), "data": image_source(config.data),
                       "seed": config.pretrain_seed}, sort_keys=True)
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    return cache_root() / "pretrained" / (f"{config.federated.pretraining}-"
                                          f"{config.pretrain.encoder}-{digest}")


def federated_encoder(config: Config, client_images: Callable[[], list[np.ndarray]], *,
                      verbose: int = 1, monitor=None) -> PretrainResult:
    """``config``'s federated pre-training, from the cache or trained now (resumed if it
    was interrupted). ``client_images()`` gives each client's unlabeled images (called only
    when there is something to train); ``monitor`` as for the server's pre-training, or a
    function that makes it."""
    out = federated_folder(config)
    meta = {"config": identity(config), "seed": config.pretrain_seed}
    cached = _finished(out, meta)
    if cached is not None:
        return cached
    if callable(monitor):
        monitor = monitor()
    prepare_out_dir(out, fix=CACHE_FIX)
    checkpoint = out / "checkpoint.npz"
    if checkpoint.exists():
        found = read_cache_entry(checkpoint, _read_meta, rebuild="starting it over")
        if found is None:
            checkpoint.unlink()
        elif found != meta:
            raise UserError(f"{checkpoint} belongs to another federated pre-training; "
                            "delete it to start this one over")
    p = plan(config)
    if verbose:
        print(f"federated pre-training {p['start']} ({config.pretrain.encoder}) on "
              f"{config.partition.num_clients} clients' unlabeled images "
              f"({p['deal']} deal of {config.data.pretrain_dataset}:"
              f"{config.data.pretrain_split}) -> {out}", flush=True)
    return federated_pretrain(config, client_images(), out, verbose=verbose, monitor=monitor)


def _read_meta(path: Path) -> dict:
    with np.load(path) as data:
        return json.loads(str(data["__record__"]))["meta"]


def _nbytes(weights) -> int:
    return int(sum(np.asarray(w).nbytes for w in weights))


def federated_pretrain(config: Config, client_images: list[np.ndarray], out_dir: str | Path,
                       *, verbose: int = 1, monitor=None) -> PretrainResult:
    """Run ``config``'s federated pre-training on ``client_images`` (uint8, one array per
    client) into ``out_dir``; resumes from its ``checkpoint.npz``."""
    out = prepare_out_dir(out_dir)
    p = plan(config)
    settings, seed = p["settings"], config.pretrain_seed
    batch, epochs, rounds = settings["batch_size"], settings["local_epochs"], settings["rounds"]
    counts = [len(x) for x in client_images]
    if min(counts) < batch:
        k = int(np.argmin(counts))
        raise UserError(f"client {k} has {counts[k]} unlabeled images, less than a batch of "
                        f"{batch}; use a smaller batch_size of the federated pre-training")
    meta = {"config": identity(config), "seed": seed}
    spec = FEDERATED_STARTS[p["start"]][0]
    algorithm = importlib.import_module(spec.module).build(settings)
    model = build_contrastive_model(config.pretrain, client_images[0].shape[1:],
                                    method=p["method"], seed=seed)
    shared = algorithm.shared(model)
    fresh = [v.numpy() for v in model.optimizer.variables]  # a fresh Adam, per client round
    step = model.make_step(config.pretrain.jit_compile)
    num_clients = len(client_images)
    sampled = max(1, int(np.ceil(settings["participation"] * num_clients)))

    global_weights = get_parts(shared)
    states = [ClientState() for _ in range(num_clients)]
    history: list[dict] = []
    totals = {"bytes_down": 0, "bytes_up": 0, "client_steps": 0, "images_trained": 0,
              "client_seconds": 0.0}
    start = 0
    checkpoint = out / "checkpoint.npz"
    if checkpoint.exists():
        start, global_weights, states, history, totals = _load(checkpoint, model, meta,
                                                               len(global_weights))
    for r in range(start, rounds):
        rng = np.random.default_rng([seed, r, 0x66656473])  # "feds": the round's sample
        chosen = np.sort(rng.choice(num_clients, sampled, replace=False))
        started = time.perf_counter()
        uploads, used, losses, stds, extra = [], [], [], [], []
        for k in chosen:
            for variable, value in zip(model.optimizer.variables, fresh):
                variable.assign(value)
            extra.append(algorithm.local_start(model, global_weights, states[k]))
            images, steps = client_images[k], counts[k] // batch
            began = time.perf_counter()
            for metric in model.metrics:
                metric.reset_state()
            for e in range(epochs):
                order = np.random.default_rng([seed, r, int(k), e]).permutation(counts[k])
                for i in range(steps):
                    logs = step(tf.constant(images[order[i * batch:(i + 1) * batch]]))
            logs = {name: float(v) for name, v in logs.items()}
            if not np.isfinite(logs["loss"]):
                raise DivergedError(f"client {k}'s {p['method']} loss became {logs['loss']} in "
                                    f"round {r + 1}; lower pretrain.learning_rate (now "
                                    f"{config.pretrain.learning_rate})")
            totals["client_seconds"] += time.perf_counter() - began
            totals["client_steps"] += steps * epochs
            totals["images_trained"] += steps * epochs * batch
            losses.append(logs["loss"])
            stds.append(logs["embedding_std"])
            uploads.append(algorithm.local_end(model, states[k]))
            used.append(counts[k])
        down = _nbytes(global_weights)
        totals["bytes_down"] += down * len(chosen)
        totals["bytes_up"] += (down + 8) * len(chosen)  # its online parts and its count
        global_weights = algorithm.aggregate(uploads, used)
        entry = {"round": r + 1, "loss": float(np.mean(losses)),
                 "embedding_std": float(np.mean(stds)), "clients": int(len(chosen)),
                 "seconds": round(time.perf_counter() - started, 3)}
        mus = [x["mu"] for x in extra if "mu" in x]
        if mus:
            entry["mu"] = float(np.mean(mus))
        if monitor is not None and monitor.due(r + 1, rounds):
            set_parts(shared, global_weights)
            entry["knn_accuracy"] = monitor.accuracy(model.encoder)
        history.append(entry)
        if verbose:
            knn = (f", kNN accuracy {entry['knn_accuracy']:.4f}" if "knn_accuracy" in entry
                   else "")
            mu = f", mu {entry['mu']:.3f}" if "mu" in entry else ""
            print(f"{p['start']} round {r + 1}/{rounds}: loss {entry['loss']:.4f}, "
                  f"embedding_std {entry['embedding_std']:.4f}{mu}{knn}, {len(chosen)} "
                  f"clients, {entry['seconds']:.1f} s", flush=True)
        _save(checkpoint, model, r + 1, meta, global_weights, states, history, totals)

    set_parts(shared, global_weights)
    encoder = model.encoder
    write_atomic(out / "encoder.keras", encoder.save)
    totals["client_seconds"] = round(totals["client_seconds"], 3)
    write_json(out / "pretrain.json", {
        "meta": meta, "history": history,
        "federated": {**{k: p[k] for k in ("start", "algorithm", "method", "deal")},
                      **settings, "clients": num_clients, "sampled_per_round": sampled,
                      "images_per_client": counts, **totals,
                      "sent": "online parts (encoder, projector, predictor) and image "
                              "counts; BYOL's target stays on the client"}})
    checkpoint.unlink(missing_ok=True)
    return PretrainResult(encoder, history, out)


def _save(path: Path, model, done: int, meta: dict, global_weights, states, history,
          totals) -> None:
    arrays = {f"v{i}": v.numpy() for i, v in enumerate(model.variables)}
    arrays.update({f"g{i}": w for i, w in enumerate(global_weights)})
    for k, state in enumerate(states):
        arrays.update({f"c{k}:{name}": a for name, a in state.arrays().items()})
    record = json.dumps({"round": done, "meta": meta, "history": history, "totals": totals,
                         "clients": len(states), "variables": len(model.variables),
                         "global": len(global_weights)})

    def save(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, __record__=np.array(record), **arrays)

    write_atomic(path, save)


def _load(path: Path, model, meta: dict, num_global: int):
    with np.load(path) as data:
        record = json.loads(str(data["__record__"]))
        arrays = {k: data[k] for k in data.files if k != "__record__"}
    if record["meta"] != meta or record["global"] != num_global \
            or record["variables"] != len(model.variables):
        raise UserError(f"{path} does not fit this federated pre-training; delete it to "
                        "start over")
    for i, variable in enumerate(model.variables):
        variable.assign(arrays[f"v{i}"])
    global_weights = [arrays[f"g{i}"] for i in range(num_global)]
    states = []
    for k in range(record["clients"]):
        prefix = f"c{k}:"
        states.append(ClientState.from_arrays({n[len(prefix):]: a for n, a in arrays.items()
                                               if n.startswith(prefix)}))
    return record["round"], global_weights, states, record["history"], record["totals"]

