"""What every driver of a federated run starts from and ends with, in the simulator and in
the Flower ServerApp alike: the classifier template, the initial pool of N models and
server state, and the run record built from where a run stands.
"""

from __future__ import annotations

from collections import OrderedDict

import keras
import numpy as np

from cpcfl_tf.clustered import algorithm
from cpcfl_tf.methods.clustering import Answers
from cpcfl_tf.models import ENCODER_DIMS, build_classifier, build_classifier_head, build_encoder
from cpcfl_tf.models.seeding import seeded
from cpcfl_tf.plan.resolve import RunPlan
from cpcfl_tf.records.record import Final, Round, RunRecord


def build_template(run: RunPlan, input_shape, num_classes: int) -> keras.Model:
    """The classifier theta = (theta_f, theta_c) every client trains, with the plan's
    encoder and head; built once per run."""
    fl = run.federated
    name = fl.encoder
    encoder = build_encoder(name, input_shape)
    return build_classifier(
        encoder, build_classifier_head(fl.head, ENCODER_DIMS[name], num_classes)
    )


def _architecture(run: RunPlan, input_shape, num_classes: int) -> tuple:
    """What decides the classifier :func:`build_template` builds (not its weights)."""
    fl = run.federated
    return (
        fl.encoder,
        fl.head,
        tuple(input_shape),
        int(num_classes),
        keras.config.dtype_policy().name,
        keras.config.floatx(),
    )


_TEMPLATES: dict[tuple, keras.Model] = {}


def template_for(run: RunPlan, input_shape, num_classes: int) -> keras.Model:
    """:func:`build_template`'s classifier, built once per process for each architecture,
    input shape and class count: the simulator's runs use it for its shapes and swap
    their weights into it (its own weights are whatever the last use left), and a build
    costs more than a smoke run's round. Nothing reads the global random streams between
    a run's seeded draws (:func:`drawn_classifier`), so a run that builds none draws what
    one that built it draws."""
    key = _architecture(run, input_shape, num_classes)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = build_template(run, input_shape, num_classes)
    return _TEMPLATES[key]


def initial_pool(
    run: RunPlan, template: keras.Model, encoder_weights, *, seed: int, attempt: int
) -> list[list[np.ndarray]]:
    """The N models the run starts from.

    With ``encoder_weights`` (pre-trained, or a FedAvg model's encoder) every model
    shares that encoder and gets its own random head (CP-CFL, FedAvg(SimCLR),
    IFCA(FedAvg)). Without, each model is a whole random classifier (FedAvg, IFCA(None));
    ``attempt`` gives IFCA's restarts new seeds.
    """
    shapes = tuple(template.input_shape[1:])
    num_classes = template.output_shape[-1]
    k = len(template.get_layer("encoder").weights)
    pool = []
    for n in range(run.num_models):
        drawn = drawn_classifier(run, shapes, num_classes, algorithm.init_seed(seed, attempt, n))
        encoder = drawn[:k] if encoder_weights is None else encoder_weights
        pool.append([np.array(w) for w in encoder] + [np.array(w) for w in drawn[k:]])
    return pool


_DRAWN: OrderedDict[tuple, list[np.ndarray]] = OrderedDict()
_DRAWN_BYTES = 256 * 2**20
"""At most this many bytes of drawn classifiers are kept (the oldest go first)."""


def drawn_classifier(
    run: RunPlan, input_shape, num_classes: int, init_seed: int
) -> list[np.ndarray]:
    """The weights of the classifier :func:`build_template` builds after
    ``keras.utils.set_random_seed(init_seed)``: Keras draws every initial weight from that
    seed, so the same key gives the same arrays. They are kept in memory, read-only (a
    caller copies what it keeps), so the runs of one process that start from the same
    draws (every seed-0 run of an architecture: a script's rows, the suite) build each
    classifier once instead of once per run. Nothing after the draw reads the global
    generators (Python's, NumPy's, TensorFlow's) without seeding them again: each run's
    random draws come from its own seeded streams, and every other build seeds first."""
    key = (*_architecture(run, input_shape, num_classes), int(init_seed))
    if key not in _DRAWN:
        with seeded(init_seed):
            _DRAWN[key] = build_template(run, input_shape, num_classes).get_weights()
        for w in _DRAWN[key]:
            w.flags.writeable = False
        while (
            len(_DRAWN) > 1 and sum(w.nbytes for ws in _DRAWN.values() for w in ws) > _DRAWN_BYTES
        ):
            _DRAWN.popitem(last=False)
    return _DRAWN[key]


def initial_state(
    run: RunPlan,
    template: keras.Model,
    encoder_weights,
    *,
    seed: int,
    attempt: int,
    num_clients: int,
    answers: Answers | None = None,
) -> algorithm.ServerState:
    """What a (re)started run begins with, in every driver (the simulator and the Flower
    ServerApp): :func:`initial_pool` and, when the server assigns the clients, each
    client's first model from their ``answers`` to what the rule asks first
    (:func:`~cpcfl_tf.clustered.algorithm.initial_assignment`)."""
    return algorithm.ServerState(
        0,
        initial_pool(run, template, encoder_weights, seed=seed, attempt=attempt),
        len(template.get_layer("encoder").weights),
        algorithm.initial_assignment(run, num_clients, answers),
        run.rule.remember(run.federated, answers),
    )


def federated_record(
    run: RunPlan,
    train_seed: int,
    progress: algorithm.Progress,
    state: algorithm.ServerState,
    accuracy: float | None,
    *,
    clients: list[dict] | None = None,
    **final,
) -> RunRecord:
    """A federated run's record as every driver writes it (this simulator, the Flower
    ServerApp): the resolved and requested config, seeds, its rounds, what was sent and
    how long it took; ``final`` adds the driver's own metrics (scores and ARI where the
    true groups are known, each node's accuracy on Flower)."""
    resolved, config = run.config, run.requested
    return RunRecord(
        resolved,
        config,
        {"data": config.seed, "train": train_seed},
        list(clients or []),
        [Round.from_json(r) for r in progress.history],
        Final(
            accuracy,
            restarts=progress.attempt,
            bytes_down=progress.bytes_down,
            bytes_up=progress.bytes_up,
            model_bytes=algorithm.model_bytes(state.models[0]),
            bytes_other=progress.bytes_other,
            **final,
        ),
        {
            "seconds": progress.seconds,
            "seconds_per_round": progress.seconds / max(1, resolved.federated.rounds),
        },
    )
