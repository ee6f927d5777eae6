"""Federated self-supervised pre-training: the encoder learned on the clients' unlabeled
images (``partition.unlabeled`` ``iid`` or ``groups``) when no server holds any.

One start (``fed-simclr``, ``fedema-byol``, ...:
:data:`cpcfl_tf.methods.ssl.FEDERATED_STARTS`) names a federated pre-training
(its stages: :mod:`~cpcfl_tf.pretraining.fedavg_ssl`,
:mod:`~cpcfl_tf.pretraining.fedema`) and the self-supervised method whose own compiled
training step the clients run. The method's model is built once; each sampled client's
round swaps weights into it, resets the optimizer to its freshly built state (a fresh
Adam per client and round, as EasyFL's clients make one) and runs E_p local epochs of
full batches over its images in a seeded order (the last partial batch of an epoch is
left out, a different one every epoch). The server sees the uploaded online parts and
image counts only. Every round is checkpointed, so an interrupted pre-training resumes
bit for bit.

The cache folder (``pretrained/<start>-<encoder>-<hash>/``) is laid out like the server's
(:mod:`cpcfl_tf.pretraining.pretrain`): ``encoder.keras`` (the global online encoder) and
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
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from cpcfl_tf.aggregation import Defence, too_few
from cpcfl_tf.compat import without_added
from cpcfl_tf.data.unlabeled import check_batch
from cpcfl_tf.errors import DivergedError, UserError
from cpcfl_tf.methods.ssl import SSLMethod
from cpcfl_tf.methods.starts import sampled_count
from cpcfl_tf.plan.resolve import OnClients, Pretraining
from cpcfl_tf.pretraining.fedavg_ssl import ClientState, get_parts, set_parts
from cpcfl_tf.pretraining.pretrain import (
    PretrainResult,
    _finished,
    build_contrastive_model,
    building_entry,
    image_source,
    keyed_settings,
)
from cpcfl_tf.records.files import cache_root, prepare_out_dir, write_atomic, write_json


def identity(pretraining: Pretraining) -> dict:
    """What a federated pre-training is, as its cache key and summary name it: the start,
    the method's settings in the server's layout, the federated settings, the defence
    (named only away from the plain mean, so keys made before it are found again), the
    deal, the partition it deals over (the ``groups`` deal follows the clients' labeled
    classes) and the clients' data."""
    p, data, ssl, fed = pretraining, pretraining.data, _ssl(pretraining), _on(pretraining)
    partition = without_added({"partition": dataclasses.asdict(fed.partition)})["partition"]
    defence = {} if fed.defence.is_default else {"defence": fed.defence.named()}
    return json.loads(
        json.dumps(
            {
                "method": p.name,
                **keyed_settings(p.pretrain, ssl.name),
                "federated": fed.settings,
                **defence,
                "partition": {**partition, "unlabeled": fed.partition.unlabeled},
                "clients": {
                    "dataset": data.client_dataset,
                    "split": data.client_train_split,
                    "partition_seed": fed.partition_seed,
                },
            }
        )
    )  # as JSON reads it back


def _on(pretraining: Pretraining) -> OnClients:
    """The clients' part of a federated pre-training's plan (refused for the server's)."""
    if pretraining.federated is None:
        raise ValueError(f"{pretraining.name} is not a federated pre-training")
    return pretraining.federated


def _ssl(pretraining: Pretraining) -> SSLMethod:
    """The self-supervised method a federated pre-training runs."""
    if pretraining.ssl is None:
        raise ValueError(f"{pretraining.name} has no self-supervised method")
    return pretraining.ssl


def federated_folder(pretraining: Pretraining) -> Path:
    """The cache folder of a federated pre-training (its pre-training seed)."""
    text = json.dumps(
        {
            "config": identity(pretraining),
            "data": image_source(pretraining.data),
            "seed": pretraining.seed,
        },
        sort_keys=True,
    )
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    return (
        cache_root()
        / "pretrained"
        / (f"{pretraining.name}-{pretraining.pretrain.encoder}-{digest}")
    )


def federated_encoder(
    pretraining: Pretraining,
    client_images: Callable[[], list[np.ndarray]],
    *,
    verbose: int = 1,
    monitor=None,
    on_round: Callable[[int, dict], None] | None = None,
) -> PretrainResult:
    """A federated pre-training, from the cache or trained now (resumed if it was
    interrupted). ``client_images()`` gives each client's unlabeled images (called only
    when there is something to train); ``monitor`` as for the server's pre-training, or a
    function that makes it; ``on_round(round, history entry)`` after each round trained."""
    out = federated_folder(pretraining)
    meta = {"config": identity(pretraining), "seed": pretraining.seed}
    cached = _finished(out, meta)
    if cached is not None:
        return cached
    if callable(monitor):
        monitor = monitor()
    with building_entry(out, meta, verbose) as cached:
        if cached is not None:  # made by another process while this one waited
            return cached
        p, data, partition = pretraining, pretraining.data, _on(pretraining).partition
        if verbose:
            print(
                f"federated pre-training {p.name} ({p.pretrain.encoder}) on "
                f"{partition.num_clients} clients' unlabeled images "
                f"({partition.unlabeled} deal of {data.pretrain_dataset}:"
                f"{data.pretrain_split}) -> {out}",
                flush=True,
            )
        return federated_pretrain(
            pretraining, client_images(), out, verbose=verbose, monitor=monitor, on_round=on_round
        )


def _nbytes(weights) -> int:
    return int(sum(np.asarray(w).nbytes for w in weights))


class LocalTrainer:
    """A client's side of a federated pre-training: the method's model built once, its
    compiled step, the optimizer as freshly built, and :meth:`round`. The simulator runs
    every client on one; a Flower node builds its own (same config, same seed), and its
    round is the same computation: the augmentation's random streams are set from (seed,
    round, client) at the start of every client round, so a client's round depends on
    nothing but the global weights, its own state and images, and those three numbers."""

    def __init__(self, pretraining: Pretraining, input_shape: tuple[int, int, int]):
        self.pretraining = pretraining
        fed = _on(pretraining)
        self.settings, self.seed = fed.settings, pretraining.seed
        self.algorithm = importlib.import_module(fed.method.module).build(self.settings)
        self.model = build_contrastive_model(
            pretraining.pretrain, input_shape, method=_ssl(pretraining), seed=self.seed
        )
        self.shared = self.algorithm.shared(self.model)
        self.fresh = [v.numpy() for v in self.model.optimizer.variables]
        self.step = self.model.make_step(pretraining.pretrain.jit_compile)
        self.streams = [
            v for v in self.model.augmenter.non_trainable_variables if "seed_generator" in v.path
        ]
        self.learning_rate = pretraining.pretrain.learning_rate
        self.defence = fed.defence

    def initial(self):
        """The global online parts before the first round (the method's seeded init)."""
        return get_parts(self.shared)

    def round(
        self, global_weights, state: ClientState, images: np.ndarray, round_: int, client: int
    ):
        """Client ``client``'s round ``round_`` (0-based) from ``global_weights``: returns
        what it sends (its online parts) and what the round's record gains (loss,
        embedding_std, steps, seconds; the method's own, as FedEMA's mu)."""
        for variable, value in zip(self.model.optimizer.variables, self.fresh):
            variable.assign(value)  # a fresh Adam per client round
        rng = np.random.default_rng([self.seed, round_, client, 0x617567])  # "aug"
        for variable in self.streams:
            variable.assign(
                np.array([rng.integers(2**31), 0], dtype=np.int64).astype(variable.dtype)
            )
        extra = self.algorithm.local_start(self.model, global_weights, state)
        batch, epochs = self.settings["batch_size"], self.settings["local_epochs"]
        steps = len(images) // batch
        check_batch(len(images), batch, f"client {client} has")
        began = time.perf_counter()
        for metric in self.model.metrics:
            metric.reset_state()
        for e in range(epochs):
            order = np.random.default_rng([self.seed, round_, client, e]).permutation(len(images))
            for i in range(steps):
                logs = self.step(tf.constant(images[order[i * batch : (i + 1) * batch]]))
        logs = {name: float(v) for name, v in logs.items()}
        if not np.isfinite(logs["loss"]):
            raise DivergedError(
                f"client {client}'s {self.pretraining.method} loss became "
                f"{logs['loss']} in round {round_ + 1}; lower "
                f"pretrain.learning_rate (now {self.learning_rate})"
            )
        sent = self.algorithm.local_end(self.model, state)
        return sent, {
            **logs,
            **extra,
            "steps": steps * epochs,
            "seconds": time.perf_counter() - began,
        }


def combine_uploads(
    algorithm,
    defence: Defence,
    uploads: list[list[np.ndarray]],
    counts: list[int],
    sent: list[np.ndarray],
) -> list[np.ndarray]:
    """A round's new global online parts from its clients' ``uploads`` (each was sent
    ``sent``) and image counts: ``algorithm``'s average (:meth:`FedAvgSSL.average`) at the
    paper's defaults, else ``defence`` (the run's ``federated.aggregation``,
    ``trim_fraction`` and ``update_norm``: the clustered rounds' functions,
    :class:`cpcfl_tf.aggregation.Defence`), with the method's average as its mean."""
    if defence.is_default:
        return algorithm.average(uploads, counts)
    stacked = [np.stack([u[i] for u in uploads]) for i in range(len(sent))]
    given = [np.broadcast_to(s, a.shape) for s, a in zip(sent, stacked)]

    def mean(arrays, sizes):
        return algorithm.average([[a[u] for a in arrays] for u in range(len(sizes))], list(sizes))

    return defence.combine(stacked, counts, given, mean=mean)


def sampled_clients(seed: int, round_: int, num_clients: int, participation: float) -> np.ndarray:
    """The clients of round ``round_`` (0-based), sorted: the server's seeded draw."""
    sampled = sampled_count(num_clients, participation)
    rng = np.random.default_rng([seed, round_, 0x66656473])  # "feds"
    return np.sort(rng.choice(num_clients, sampled, replace=False))


@dataclasses.dataclass
class Uploads:
    """What a round's sampled clients sent back, by client id: each one's online parts and
    image count, and its round's results (:meth:`LocalTrainer.round`'s: loss,
    embedding_std, steps, seconds, the method's own). ``reached``: how many clients the global
    parts were sent to; ``failed``: the sampled clients that sent nothing."""

    uploads: list[list[np.ndarray]]
    counts: list[int]
    results: list[dict]
    reached: int
    failed: list[int] = dataclasses.field(default_factory=list)


class LocalClients:
    """The simulator's clients: each sampled client's round on one :class:`LocalTrainer`,
    with its own state (kept in ``states``, which the checkpoint saves) and images. The
    Flower ServerApp's counterpart sends the same rounds to its nodes."""

    def __init__(
        self, trainer: LocalTrainer, client_images: list[np.ndarray], states: list[ClientState]
    ):
        self.trainer, self.images, self.states = trainer, client_images, states

    def train(self, global_weights, round_: int, chosen: np.ndarray) -> Uploads:
        uploads, results = [], []
        for k in chosen:
            sent, result = self.trainer.round(
                global_weights, self.states[k], self.images[k], round_, int(k)
            )
            uploads.append(sent)
            results.append(result)
        return Uploads(uploads, [len(self.images[k]) for k in chosen], results, len(chosen))


def new_totals() -> dict:
    """The federated pre-training's running totals (``pretrain.json``'s)."""
    return {
        "bytes_down": 0,
        "bytes_up": 0,
        "client_steps": 0,
        "images_trained": 0,
        "client_seconds": 0.0,
    }


def pretrain_rounds(
    trainer: LocalTrainer,
    clients,
    num_clients: int,
    global_weights,
    totals: dict,
    *,
    start: int = 0,
    after: Callable[[int, dict, list], None] | None = None,
) -> list[np.ndarray]:
    """Rounds ``start``.. of the federated pre-training, the one loop of both drivers (the
    simulator's :class:`LocalClients`, the Flower ServerApp's nodes): per round the
    server's seeded sample, the sampled clients' rounds (``clients.train``), the method's
    aggregate of what came back (:func:`combine_uploads`: weighted by image counts, or the
    run's defence). Counts bytes each way (the
    global parts down; each reply's parts and its 8-byte count up) and the clients'
    compute into ``totals``; ``after(round, entry, global_weights)`` after each round
    (``entry``: :func:`round_entry`'s). Returns the global online parts."""
    settings, seed = trainer.settings, trainer.seed
    for r in range(start, settings["rounds"]):
        chosen = sampled_clients(seed, r, num_clients, settings["participation"])
        started = time.perf_counter()
        replies = clients.train(global_weights, r, chosen)
        for result in replies.results:
            totals["client_seconds"] += result["seconds"]
            totals["client_steps"] += result["steps"]
            totals["images_trained"] += result["steps"] * settings["batch_size"]
        down = _nbytes(global_weights)
        totals["bytes_down"] += down * replies.reached
        totals["bytes_up"] += (down + 8) * len(replies.uploads)  # its online parts and count
        if replies.uploads:
            global_weights = combine_uploads(
                trainer.algorithm, trainer.defence, replies.uploads, replies.counts, global_weights
            )
        entry = round_entry(
            r, replies.results, time.perf_counter() - started, trainer.algorithm.reported
        )
        if too_few(trainer.defence.aggregation, len(replies.uploads)):
            entry["too_few_to_defend"] = True
        if replies.failed:
            entry["failed"] = list(replies.failed)
        if after is not None:
            after(r, entry, global_weights)
    return global_weights


def round_entry(
    round_: int, results: list[dict], seconds: float, reported: tuple[str, ...] = ()
) -> dict:
    """A round's history entry from its clients' results (:meth:`LocalTrainer.round`),
    with the mean of each ``reported`` result the clients gave (the method's own:
    ``FedAvgSSL.reported``)."""

    def mean(key):
        return float(np.mean([r[key] for r in results])) if results else float("nan")

    entry = {
        "round": round_ + 1,
        "loss": mean("loss"),
        "embedding_std": mean("embedding_std"),
        "clients": len(results),
        "seconds": round(seconds, 3),
    }
    for key in reported:
        values = [r[key] for r in results if key in r]
        if values:
            entry[key] = float(np.mean(values))
    return entry


def federated_pretrain(
    pretraining: Pretraining,
    client_images: list[np.ndarray],
    out_dir: str | Path,
    *,
    verbose: int = 1,
    monitor=None,
    on_round: Callable[[int, dict], None] | None = None,
) -> PretrainResult:
    """Run a federated pre-training on ``client_images`` (uint8, one array per client)
    into ``out_dir``; resumes from its ``checkpoint.npz``. ``monitor``: the kNN monitor
    (its ``due`` counts rounds); ``on_round(round, entry)`` after each round."""
    out = prepare_out_dir(out_dir)
    p, fed = pretraining, _on(pretraining)
    settings, seed = fed.settings, p.seed
    batch, rounds = settings["batch_size"], settings["rounds"]
    counts = [len(x) for x in client_images]
    check_batch(min(counts), batch, f"client {int(np.argmin(counts))} has")
    meta = {"config": identity(p), "seed": seed}
    trainer = LocalTrainer(p, client_images[0].shape[1:])
    num_clients = len(client_images)

    global_weights = trainer.initial()
    states = [ClientState() for _ in range(num_clients)]
    history: list[dict] = []
    totals = new_totals()
    start = 0
    checkpoint = out / "checkpoint.npz"
    if checkpoint.exists():
        start, global_weights, states, history, totals = _load(
            checkpoint, trainer.model, meta, len(global_weights)
        )

    def after(r: int, entry: dict, weights) -> None:
        if monitor is not None and monitor.due(r + 1, rounds):
            set_parts(trainer.shared, weights)
            entry["knn_accuracy"] = monitor.accuracy(trainer.model.encoder)
        history.append(entry)
        if verbose:
            knn = f", kNN accuracy {entry['knn_accuracy']:.4f}" if "knn_accuracy" in entry else ""
            own = "".join(
                f", {key} {entry[key]:.3f}" for key in trainer.algorithm.reported if key in entry
            )
            print(
                f"{p.name} round {r + 1}/{rounds}: loss {entry['loss']:.4f}, "
                f"embedding_std {entry['embedding_std']:.4f}{own}{knn}, {entry['clients']} "
                f"clients, {entry['seconds']:.1f} s",
                flush=True,
            )
        _save(checkpoint, trainer.model, r + 1, meta, weights, states, history, totals)
        if on_round:
            on_round(r + 1, entry)

    global_weights = pretrain_rounds(
        trainer,
        LocalClients(trainer, client_images, states),
        num_clients,
        global_weights,
        totals,
        start=start,
        after=after,
    )

    set_parts(trainer.shared, global_weights)
    encoder = trainer.model.encoder
    write_atomic(out / "encoder.keras", encoder.save)
    totals["client_seconds"] = round(totals["client_seconds"], 3)
    write_json(
        out / "pretrain.json",
        {
            "meta": meta,
            "history": history,
            "federated": {
                "start": p.name,
                "algorithm": fed.method.name,
                "method": _ssl(p).name,
                "deal": fed.partition.unlabeled,
                **settings,
                "clients": num_clients,
                "sampled_per_round": len(
                    sampled_clients(seed, 0, num_clients, settings["participation"])
                ),
                "images_per_client": counts,
                **totals,
                **({} if fed.defence.is_default else {"defence": fed.defence.named()}),
                "sent": "online parts (encoder, projector, predictor) and image "
                "counts; BYOL's target stays on the client",
            },
        },
    )
    checkpoint.unlink(missing_ok=True)
    return PretrainResult(encoder, history, out)


def _save(
    path: Path, model, done: int, meta: dict, global_weights, states, history, totals
) -> None:
    arrays = {f"v{i}": v.numpy() for i, v in enumerate(model.variables)}
    arrays.update({f"g{i}": w for i, w in enumerate(global_weights)})
    for k, state in enumerate(states):
        arrays.update({f"c{k}:{name}": a for name, a in state.arrays().items()})
    record = json.dumps(
        {
            "round": done,
            "meta": meta,
            "history": history,
            "totals": totals,
            "clients": len(states),
            "variables": len(model.variables),
            "global": len(global_weights),
        }
    )

    def save(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, __record__=np.array(record), **arrays)

    write_atomic(path, save)


def _load(path: Path, model, meta: dict, num_global: int):
    with np.load(path) as data:
        record = json.loads(str(data["__record__"]))
        arrays = {k: data[k] for k in data.files if k != "__record__"}
    if (
        record["meta"] != meta
        or record["global"] != num_global
        or record["variables"] != len(model.variables)
    ):
        raise UserError(f"{path} does not fit this federated pre-training; delete it to start over")
    for i, variable in enumerate(model.variables):
        variable.assign(arrays[f"v{i}"])
    global_weights = [arrays[f"g{i}"] for i in range(num_global)]
    states = []
    for k in range(record["clients"]):
        prefix = f"c{k}:"
        states.append(
            ClientState.from_arrays(
                {n[len(prefix) :]: a for n, a in arrays.items() if n.startswith(prefix)}
            )
        )
    return record["round"], global_weights, states, record["history"], record["totals"]
