"""The federated simulator: FedAvg, IFCA and CP-CFL as configurations of one loop.

A round (Algorithm "CP-CFL"): the participating clients get the pool of N models;
each picks a cluster, at random for ``t < Tc`` (training the head only) and by the
lowest loss on its *training* data afterwards; trains it locally; the server averages
each cluster's updates weighted by data size. Test data is touched only to report
accuracy. The server side only ever sees weights, counts and cluster ids.

The run checkpoints after every round (atomically) and resumes to exactly the result of
an uninterrupted run: every random draw comes from a generator seeded by (train seed,
attempt, round, purpose), not from a running state.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cpcfl_tf.clustered import algorithm, restarts
from cpcfl_tf.clustered.backends import backend_of, client_losses, client_probabilities
from cpcfl_tf.clustered.clients import ClientArrays, Clients
from cpcfl_tf.clustered.local import (
    MODEL,
    ClientMoments,
    ClientParts,
    LocalTraining,
    Stacked,
    batch_orders,
    stack_models,
    unstack,
)
from cpcfl_tf.clustered.metrics import client_accuracy, cluster_ari, pooled_scores
from cpcfl_tf.clustered.pool import federated_record, initial_state, template_for
from cpcfl_tf.compat import changed_behaviour, without_added
from cpcfl_tf.errors import DivergedError, UserError
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.plan.resolve import RunPlan
from cpcfl_tf.plan.sections import FederatedConfig
from cpcfl_tf.records.files import read_file, weights_fingerprint, write_atomic
from cpcfl_tf.records.record import Round, RunRecord


def _save(
    path: Path,
    fingerprint: str,
    state: algorithm.ServerState,
    progress: algorithm.Progress,
    moments: ClientMoments | None,
    parts: ClientParts | None = None,
):
    arrays = {f"m{n}_{i}": a for n, m in enumerate(state.models) for i, a in enumerate(m)}
    arrays.update({f"memory_{k}": a for k, a in state.memory.items()})  # the rule's own
    if moments is not None:  # the clients' own optimizer state (optimizer_state="client")
        arrays.update({f"client_{k}": a for k, a in moments.arrays().items()})
    if parts is not None:  # what each client keeps (a personalized method's part)
        arrays.update({f"kept_{i}": a for i, a in zip(parts.index, parts.arrays)})
    meta = {
        "fingerprint": fingerprint,
        "progress": dataclasses.asdict(progress),
        "num_models": len(state.models),
        "num_arrays": len(state.models[0]),
        "num_encoder": state.num_encoder,
    }
    if state.assignment is not None:  # the server's assignment (methods whose server assigns)
        meta["assignment"] = state.assignment.tolist()
    stored: dict[str, Any] = {"__meta__": np.array(json.dumps(meta)), **arrays}

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **stored)

    write_atomic(path, write)


def _load(
    path: Path, fingerprint: str
) -> tuple[algorithm.ServerState, algorithm.Progress, ClientMoments | None, ClientParts | None]:
    def load(p: Path):
        with np.load(p) as data:
            meta = json.loads(str(data["__meta__"]))
            models = [
                [data[f"m{n}_{i}"] for i in range(meta["num_arrays"])]
                for n in range(meta["num_models"])
            ]
            client = {k[len("client_") :]: data[k] for k in data.files if k.startswith("client_")}
            memory = {k[len("memory_") :]: data[k] for k in data.files if k.startswith("memory_")}
            kept = {int(k[len("kept_") :]): data[k] for k in data.files if k.startswith("kept_")}
        parts = ClientParts(tuple(sorted(kept)), [kept[i] for i in sorted(kept)]) if kept else None
        return meta, models, memory, ClientMoments.from_arrays(client) if client else None, parts

    meta, models, memory, moments, parts = read_file(
        path, load, fix="delete it to start the run over"
    )
    if meta["fingerprint"] != fingerprint:
        raise UserError(
            f"checkpoint {path} belongs to a different run (config or seeds "
            "differ); delete it or choose another --out"
        )
    progress = algorithm.Progress(**meta["progress"])
    assignment = meta.get("assignment")
    return (
        algorithm.ServerState(
            progress.round,
            models,
            meta["num_encoder"],
            None if assignment is None else np.array(assignment, np.int64),
            memory,
        ),
        progress,
        moments,
        parts,
    )


def run_federated(
    run: RunPlan,
    clients: Clients,
    *,
    encoder_weights=None,
    checkpoint: str | Path | None = None,
    train_seed: int | None = None,
    on_round: Callable[[dict, algorithm.ServerState], None] | None = None,
    context: RunContext = RunContext(),
) -> tuple[RunRecord, algorithm.ServerState]:
    """Run ``run.federated`` on ``clients``.

    Parameters
    ----------
    run
        The run's plan (:func:`cpcfl_tf.plan.resolve.resolve`).
    clients
        From :func:`cpcfl_tf.clustered.clients.make_clients`.
    encoder_weights
        The shared starting encoder (pre-trained, or a FedAvg model's), or ``None``
        for random initialisation.
    checkpoint
        ``.npz`` path: written after every round; an existing one (of the same run) is
        resumed. ``None``: no checkpoints.
    train_seed
        Seeds initialisation, selection, participation and batch order (default
        ``config.seed``).
    on_round
        Called after every round with the round's record and the new server state.
    context
        What it reads of the script's :class:`~cpcfl_tf.plan.context.RunContext`:
        ``verbose`` (1: one line per round; 0: silent), ``max_clients`` (at most this
        many clients in one training step: bounds memory for many clients, the result is
        the same) and ``diagnose`` (the selection diagnostic in the first ``diagnose``
        rounds the clients choose by loss, :mod:`cpcfl_tf.clustered.diagnostics`; an
        observation). None of them is part of the run's config.

    Returns
    -------
    (record, state)
        ``record`` (:class:`~cpcfl_tf.records.record.RunRecord`) holds ``rounds`` (per-round
        accuracy and cluster ids, F1/AUROC at the reporting rounds) and ``final`` (the
        contract's metrics, ARI, restarts and bytes sent); the runner adds ``experiment``
        and ``environment``. ``state`` is the final server state (the pool of models).
    """
    if not isinstance(run, RunPlan):
        raise TypeError(
            f"run_federated takes the run's plan, resolve(config), got {type(run).__name__}"
        )
    config, fl = run.requested, run.federated
    seed = config.seed if train_seed is None else train_seed
    shape = clients.train.images.shape[2:]
    template = template_for(run, shape, clients.num_classes)
    backend = backend_of(template, fl)
    # Fields added since a checkpoint was written leave its fingerprint as it was.
    fingerprint = json.dumps(
        {
            "config": without_added(config.to_dict()),
            **without_added({"federated": dataclasses.asdict(fl)}),
            "seed": seed,
            "clients": clients.records,
            "encoder": weights_fingerprint(encoder_weights),
            **changed_behaviour(dataclasses.asdict(fl)),
        },
        sort_keys=True,
    )
    path = Path(checkpoint) if checkpoint else None

    simulation = _Simulation(run, backend, clients, seed, context.max_clients)
    # What the rule asks each client once before training (PACFL: its data subspace).
    answers = first_answers(run, clients, embedder(template, encoder_weights))

    def start(attempt: int) -> algorithm.ServerState:
        state = initial_state(
            run,
            template,
            encoder_weights,
            seed=seed,
            attempt=attempt,
            num_clients=clients.train.num_clients,
            answers=answers,
        )
        # optimizer_state="client": every client keeps its Adam state between rounds.
        simulation.moments = (
            ClientMoments.zeros(state.models[0], clients.train.num_clients)
            if fl.optimizer_state == "client"
            else None
        )
        # A personalized method: every client keeps its part, from the pool's first model.
        kept = algorithm.kept_arrays(run, state.num_encoder, len(state.models[0]))
        simulation.parts = (
            ClientParts.of(state.models[0], kept, clients.train.num_clients) if kept else None
        )
        return state

    state = progress = None
    if path and path.exists():
        state, progress, simulation.moments, simulation.parts = _load(path, fingerprint)
    else:
        progress = algorithm.sent_before_training(run, answers)

    def after(record: dict, state: algorithm.ServerState, progress: algorithm.Progress):
        if path:
            _save(path, fingerprint, state, progress, simulation.moments, simulation.parts)
        if context.verbose:
            _report(record, fl, progress)
        if on_round:
            on_round(record, state)

    state, progress = algorithm.run_rounds(
        run,
        seed,
        simulation,
        start,
        state=state,
        progress=progress,
        on_round=after,
        say=(lambda line: print("  " + line, flush=True)) if context.verbose else None,
        diagnose=context.diagnose,
    )
    last = Round.from_json(progress.history[-1])
    record = federated_record(
        run,
        seed,
        progress,
        state,
        last.accuracy,
        scores=last.scores,
        ari=cluster_ari(clients.groups, np.array(progress.assigned, np.int64)),
        clients=clients.records,
        bytes_kept=0 if simulation.parts is None else simulation.parts.nbytes,
    )
    return record, state


def first_answers(
    run: RunPlan, clients: Clients, embed: Callable[[np.ndarray], np.ndarray] | None = None
) -> list[np.ndarray] | None:
    """Each client's answer to what its method's rule asks before training, from its own
    training images, or their embeddings by ``embed`` where the rule reads those (and its
    true group: the oracle); None when the rule asks nothing."""
    rule = run.rule
    if rule.asks is None:
        return None
    question = rule.question(run.federated)
    if rule.reads == "embeddings" and embed is None:
        raise ValueError(f"rule {rule.name} reads embeddings: pass the encoder's embed")
    read = embed if embed is not None and rule.reads == "embeddings" else (lambda images: images)
    return [
        rule.answer(question, read(images), int(group))
        for images, group in zip(clients.train.images, clients.groups)
    ]


def embedder(template, encoder_weights) -> Callable[[np.ndarray], np.ndarray]:
    """Images -> their embeddings by the starting encoder (frozen, inference mode), on the
    template's encoder, whose weights are put back after (one trace for all clients)."""
    from cpcfl_tf.pretraining.linear_eval import features_of

    encoder = template.get_layer("encoder")
    features = features_of(encoder)  # traced at its first call

    def embed(images: np.ndarray) -> np.ndarray:
        if encoder_weights is None:
            raise UserError(
                "this method's clients answer from a pre-trained encoder's "
                "features: give it one (federated.pretraining)"
            )
        kept = encoder.get_weights()
        encoder.set_weights(encoder_weights)
        try:
            return features(images)
        finally:
            encoder.set_weights(kept)

    return embed


class _Simulation:
    """The simulator's :class:`~cpcfl_tf.clustered.algorithm.Federation`: every client in
    this process, trained together by a backend."""

    def __init__(
        self,
        run: RunPlan,
        backend,
        clients: Clients,
        seed: int,
        max_clients: int | None = None,
    ):
        self.fl, self.method = run.federated, run.method
        self.backend, self.clients = backend, clients
        self.seed, self.attempt, self.max_clients = seed, 0, max_clients
        self.num_clients = clients.train.num_clients
        self.local = LocalTraining.of(self.fl)
        # A personal model beside the shared one (Ditto) trains towards the shared one.
        self.personal = (
            dataclasses.replace(self.local, prox=float((self.fl.options or {})["lambda"]))
            if self.method.keeps == "model"
            else self.local
        )
        self.moments: ClientMoments | None = None
        self.parts: ClientParts | None = None

    def train(self, models, plan: algorithm.RoundPlan) -> algorithm.Replies:
        fl, part = self.fl, plan.participants
        train = (
            self.clients.train.subset(part) if len(part) < self.num_clients else self.clients.train
        )
        losses = None if plan.drawn is not None else client_losses(self.backend, models, train)
        ids = algorithm.select(plan, losses)
        orders = batch_orders(len(part), train.size, fl.local_epochs, plan.batch_seed)
        own = None if self.moments is None else self.moments.subset(part)
        epochs = algorithm.epoch_parts(fl, plan)
        self.attempt = plan.attempt
        parts = self.parts
        beside = parts is not None and self.method.keeps == "model"  # a personal model
        if parts is None or beside:
            stacked = stack_models(models)
            trained = self._trained(lambda rows: (stacked, ids[rows]), train, orders, epochs, own)
        if parts is not None:  # each client's own model: the shared one with its kept part

            def own_models(rows: np.ndarray) -> tuple[Stacked, np.ndarray]:
                return parts.models(models[0], part[rows]), np.arange(len(rows))

            if beside:  # Ditto: each also trains its personal model, towards the shared one
                personal = self._trained(
                    own_models, train, orders, epochs, None, local=self.personal, anchor=models[0]
                )
                parts.put(part, personal)
            else:  # each trains its own model, the shared part and its kept one
                trained = self._trained(own_models, train, orders, epochs, own)
                parts.put(part, trained)
                kept = set(parts.index)  # never sent: the server's own there, as views
                trained = [
                    np.broadcast_to(models[0][i], a.shape) if i in kept else a
                    for i, a in enumerate(trained)
                ]
        if self.moments is not None and own is not None:
            self.moments.put(part, own)
        if not all(np.isfinite(a).all() for a in trained):
            raise DivergedError(
                f"local training diverged (NaN/Inf weights) in round "
                f"{plan.round + 1}; lower federated.learning_rate (now "
                f"{fl.learning_rate})"
            )
        return algorithm.Replies(part, ids, self.clients.sizes[part], trained, losses=losses)

    def _trained(
        self,
        pool_for: Callable[[np.ndarray], tuple[Stacked, np.ndarray]],
        train: ClientArrays,
        orders: np.ndarray,
        epochs: list[str],
        moments: ClientMoments | None,
        *,
        local: LocalTraining | None = None,
        anchor: list[np.ndarray] | None = None,
    ) -> Stacked:
        """The backend's training of the round's clients, at most :attr:`max_clients` in
        one step (memory: the weights and Adam state of that many models); the clients
        are independent, so chunks give the unchunked result. ``pool_for(rows)``: the
        stacked models rows ``rows`` of the round's clients train from, and which model
        each trains; ``local`` (default the run's) and ``anchor`` as the backend takes
        them."""
        count, most = train.num_clients, self.max_clients or train.num_clients
        pieces = []
        for lo in range(0, count, most):
            rows = np.arange(lo, min(lo + most, count))
            whole = len(rows) == count
            pool, ids = pool_for(rows)
            own = None if moments is None or whole else moments.subset(rows)
            pieces.append(
                self.backend.train(
                    pool,
                    ids,
                    train if whole else train.subset(rows),
                    orders if whole else orders[:, rows],
                    epochs,
                    local or self.local,
                    moments if whole else own,
                    anchor,
                )
            )
            if moments is not None and own is not None:
                moments.put(rows, own)
        if len(pieces) == 1:
            return pieces[0]
        return [np.concatenate([p[i] for p in pieces]) for i in range(len(pieces[0]))]

    def observe(self, models, assigned, replies, round_: int, *, planned=None) -> dict:
        if self.method.fine_tunes and self.fl.scored(round_):
            # Each client is scored with its fine-tuned copy of the round's model.
            tuned = self._fine_tuned(models[0], round_)
            own = [unstack(tuned, u) for u in range(self.num_clients)]
        elif self.parts is not None:  # a personalized method: each with its own model
            own = [self.parts.model(models[0], u) for u in range(self.num_clients)]  # views
        else:
            return _evaluate(self.backend, models, assigned, self.clients, round_, self.fl, planned)
        record = _evaluate(
            self.backend, own, np.arange(self.num_clients), self.clients, round_, self.fl
        )
        return {**record, "cluster_ids": assigned.tolist()}

    def _fine_tuned(self, model: list[np.ndarray], round_: int) -> Stacked:
        """Every client's copy of ``model`` after ``finetune_epochs`` local epochs of the
        whole model on its training data (fresh optimizer state, its own batch order:
        :attr:`~cpcfl_tf.clustered.algorithm.Stream.FINE_TUNE` of round ``round_``)."""
        epochs = int((self.fl.options or {})["finetune_epochs"])
        train = self.clients.train
        seed = algorithm.stream_seed(self.seed, self.attempt, round_, algorithm.Stream.FINE_TUNE)
        orders = batch_orders(self.num_clients, train.size, epochs, seed)
        stacked = stack_models([model])
        ids = np.zeros(self.num_clients, np.int64)
        parts = [MODEL] * epochs
        return self._trained(lambda rows: (stacked, ids[rows]), train, orders, parts, None)


def _evaluate(
    backend,
    models,
    assigned,
    clients: Clients,
    round_: int,
    fl: FederatedConfig,
    planned: np.ndarray | None = None,
) -> dict:
    """Accuracy on the clients' test data with their cluster's model; F1/AUROC at the
    reporting rounds. A client that has not taken part yet is scored with the model the
    server assigned it (``planned``), else the one it would choose (lowest loss on its
    training data). In the rounds ``fl.scored`` skips nobody is scored: no accuracy."""
    if not fl.scored(round_):
        return {"accuracy": None, "cluster_ids": assigned.tolist()}
    ids = assigned.copy()
    unseen = np.flatnonzero(ids < 0)
    if len(unseen) and planned is not None:
        ids[unseen] = planned[unseen]
    elif len(unseen):
        losses = client_losses(backend, models, clients.train.subset(unseen))
        ids[unseen] = losses.argmin(axis=1)
    probs = client_probabilities(backend, models, ids, clients.test)
    record = {
        "accuracy": float(client_accuracy(clients.test.labels, probs).mean()),
        "cluster_ids": assigned.tolist(),
    }
    if round_ % fl.report_every == 0 or round_ == fl.rounds:
        record.update(pooled_scores(clients.test.labels, probs))
    return record


def _report(record: dict, fl: FederatedConfig, progress: algorithm.Progress) -> None:
    """The run's progress line: on a terminal rewritten in place, in a log one per round."""
    done = progress.round
    counts = restarts.cluster_sizes(record["cluster_ids"], fl.num_clusters)
    # Time of this process's rounds: a resumed run counts from its checkpoint's total. After
    # a restart (progress back at round 0) the line is the failed attempt's last round.
    eta = progress.seconds / max(1, done or record["round"]) * (fl.rounds - done)
    accuracy = "-" if record["accuracy"] is None else f"{record['accuracy']:.4f}"
    line = (
        f"  round {record['round']}/{fl.rounds}: accuracy {accuracy}, clusters "
        f"{counts.tolist()}, {_clock(progress.seconds)} elapsed, ETA {_clock(eta)}"
    )
    end = "\n" if done == fl.rounds or not sys.stdout.isatty() else "\r"
    print(line, end=end, flush=True)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
