"""How clients compute: losses for selection, local training, test predictions.

Two backends with one interface, so the rounds in :mod:`cpcfl_tf.clustered.simulator`
do not care which one runs:

* :class:`StackedBackend` trains *all* clients in one compiled step. Their weights are
  stacked on a leading client axis; each client's convolutions are separate ops of one
  graph (which the runtime spreads over the cores) and dense layers run as one batched
  matmul. Every client
  has the same number of examples (the paper's protocol), so the clients' batches line
  up, and Adam is elementwise, so this is exactly K independent local trainings. It
  covers classifiers made of Conv2D, Flatten and Dense layers: the paper's CNN with any
  head.
* :class:`KerasBackend` trains clients one after another on one Keras model whose
  weights are swapped in: any architecture (ResNets), and the reference the stacked
  backend is tested against.

Local training (Sec. "Experimental settings"): E epochs of batch 32, Adam 1e-3 with a
fresh state per client per round, cross-entropy. ``epochs`` says what each of the E
epochs trains (:func:`cpcfl_tf.clustered.algorithm.epoch_parts`: the whole model; the
head alone, in every epoch during ``t < Tc`` and after the first E_l,f otherwise; the
encoder alone under a fixed head, FedRep's representation epochs). In a head epoch the
encoder is *frozen* as Keras freezes a model: its weights, BatchNormalization
statistics included, do not change and it runs in inference mode, so the head trains on
the features that selection and evaluation see.

How a client trains, and the Adam state clients may keep, are
:mod:`cpcfl_tf.clustered.local`'s; the stacked backend is :mod:`cpcfl_tf.clustered.stacked`.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from cpcfl_tf.clustered.clients import ClientArrays
from cpcfl_tf.clustered.local import (
    ENCODER,
    HEAD,
    MODEL,
    ClientMoments,
    LocalTraining,
    Stacked,
    stack_models,
    unstack,
)
from cpcfl_tf.clustered.stacked import StackedBackend, stackable_layers
from cpcfl_tf.data.images import to_float
from cpcfl_tf.errors import UserError


class KerasBackend:
    """Clients one by one on a single Keras classifier with swapped-in weights."""

    def __init__(
        self, classifier: keras.Model, *, eval_batch: int = 512, jit_compile: bool = False
    ):
        self.model = classifier
        self.num_encoder = len(classifier.get_layer("encoder").weights)
        self.eval_batch = eval_batch
        self.optimizers = {"adam": keras.optimizers.Adam(1e-3), "sgd": keras.optimizers.SGD(1e-3)}
        for optimizer in self.optimizers.values():
            optimizer.build(classifier.trainable_variables)
        self._steps = {
            (name, part, prox): tf.function(
                self._make_step(optimizer, part, prox), jit_compile=jit_compile, autograph=False
            )
            for name, optimizer in self.optimizers.items()
            for part in (MODEL, HEAD, ENCODER)
            for prox in (False, True)
        }
        self._forward = tf.function(
            lambda x: classifier(to_float(x), training=False),
            reduce_retracing=True,
            autograph=False,
        )

    def _make_step(self, optimizer: keras.optimizers.Optimizer, part: str, prox: bool):
        encoder, head = self.model.get_layer("encoder"), self.model.get_layer("head")
        variables = {
            MODEL: self.model.trainable_variables,
            HEAD: head.trainable_variables,
            ENCODER: encoder.trainable_variables,
        }[part]
        # Where each trained variable is in get_weights order (for the anchor's arrays).
        position = {id(w): i for i, w in enumerate(self.model.weights)}
        index = [position[id(v)] for v in variables]

        def step(images, labels, anchor=(), lam=0.0):
            x = to_float(images)
            # A frozen encoder runs in inference mode (BatchNormalization uses and keeps
            # its moving statistics), as Keras runs a layer with trainable=False.
            features = encoder(x, training=False) if part == HEAD else None
            with tf.GradientTape() as tape:
                probs = (
                    head(features, training=True) if part == HEAD else self.model(x, training=True)
                )
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, probs))
            grads = tape.gradient(loss, variables)
            if prox:  # the gradient of lam / 2 * ||w - anchor||^2
                grads = [g + lam * (v - anchor[i]) for g, v, i in zip(grads, variables, index)]
            optimizer.apply(grads, variables)
            return loss

        return step

    def train(
        self,
        pool: Stacked,
        ids: np.ndarray,
        data: ClientArrays,
        orders: np.ndarray,
        epochs: Sequence[str],
        local: LocalTraining,
        moments: ClientMoments | None = None,
        anchor: Sequence[np.ndarray] | None = None,
    ) -> Stacked:
        if local.prox and anchor is None:
            raise ValueError("local.prox pulls towards an anchor model: pass it")
        if moments is not None:
            raise UserError(
                "federated.optimizer_state 'client' needs the stacked backend "
                "(the CNN encoder); use optimizer_state fresh"
            )
        if local.frozen_features:
            raise UserError(
                "federated.frozen_features needs the stacked backend (the CNN "
                "encoder); set it false"
            )
        optimizer = self.optimizers[local.optimizer]
        optimizer.learning_rate.assign(local.learning_rate)
        # The optimizer's state (moments, step count), reset per client; not its rate.
        state = [v for v in optimizer.variables if "learning_rate" not in v.path]
        prox = bool(local.prox)
        pull = (
            ([tf.constant(a) for a in anchor], tf.constant(local.prox, tf.float32))
            if prox and anchor is not None
            else ()
        )
        trained = []
        for u in range(data.num_clients):
            self.model.set_weights(unstack(pool, ids[u]))
            for var in state:
                var.assign(tf.zeros_like(var))
            for epoch, order in enumerate(orders):
                step = self._steps[local.optimizer, epochs[epoch], prox]
                for lo in range(0, data.size, local.batch_size):
                    idx = order[u, lo : lo + local.batch_size]
                    step(tf.constant(data.images[u, idx]), tf.constant(data.labels[u, idx]), *pull)
            trained.append(self.model.get_weights())
        return stack_models(trained)

    def logits(self, model: list[np.ndarray], images: np.ndarray) -> np.ndarray:
        self.model.set_weights(model)
        probs = np.concatenate(
            [
                self._forward(tf.constant(images[lo : lo + self.eval_batch])).numpy()
                for lo in range(0, len(images), self.eval_batch)
            ]
        )
        return np.log(np.clip(probs, 1e-12, None))


_STACKED: dict[tuple, StackedBackend] = {}


def backend_of(classifier: keras.Model, fl) -> StackedBackend | KerasBackend:
    """The backend a :class:`~cpcfl_tf.plan.sections.FederatedConfig` names (``backend``,
    ``jit_compile``) for ``classifier``."""
    return make_backend(classifier, fl.backend, jit_compile=fl.jit_compile)


def make_backend(classifier: keras.Model, kind: str = "auto", *, jit_compile: bool = False):
    """``stacked`` when the classifier allows it (``auto``), else ``keras``;
    ``jit_compile`` XLA-compiles their steps (``federated.jit_compile``).

    A stacked backend holds no weights, only compiled steps, so runs of the same
    architecture share one (tracing the K-client step costs seconds per run).
    """
    layers = stackable_layers(classifier)
    if kind == "keras" or (kind == "auto" and layers is None):
        return KerasBackend(classifier, jit_compile=jit_compile)
    if layers is None:
        raise UserError(
            "federated.backend=stacked cannot stack this model's layers; "
            "set federated.backend=auto or keras"
        )
    key = (
        tuple(layers),
        tuple(tuple(w.shape) for w in classifier.weights),
        len(classifier.get_layer("encoder").weights),
        jit_compile,
    )
    if key not in _STACKED:
        _STACKED[key] = StackedBackend(classifier, jit_compile=jit_compile)
    return _STACKED[key]


# ------------------------------------------------------------- shared by both backends


def client_losses(backend, pool: Sequence[list[np.ndarray]], data: ClientArrays) -> np.ndarray:
    """``(K, N)``: mean cross-entropy of every pool model on each client's data.

    Pool models with the same encoder (all of them at the end of the Tc phase, and in
    every round of a run whose clients never train it, ``encoder_epochs=0``) share one
    pass of it over the images on the stacked backend: the same bits as a pass each."""
    flat = data.images.reshape(-1, *data.images.shape[2:])
    labels = data.labels.reshape(-1)
    out = np.empty((data.num_clients, len(pool)))
    for group in shared_encoders(pool, backend.num_encoder):
        if len(group) > 1 and isinstance(backend, StackedBackend):
            k = backend.num_encoder
            features = backend.features(pool[group[0]][:k], flat)
            logits_of = {n: backend.head_logits(pool[n][k:], features) for n in group}
        else:
            logits_of = {n: backend.logits(pool[n], flat) for n in group}
        for n, logits in logits_of.items():
            logp = logits - _logsumexp(logits)
            out[:, n] = (
                -logp[np.arange(len(labels)), labels].reshape(data.labels.shape).mean(axis=1)
            )
    return out


def shared_encoders(pool: Sequence[list[np.ndarray]], num_encoder: int) -> list[list[int]]:
    """The pool's models grouped by equal encoder weights (the first ``num_encoder``
    arrays), each group in pool order."""
    groups: list[list[int]] = []
    for n, model in enumerate(pool):
        for group in groups:
            first = pool[group[0]]
            if all(
                a is b or np.array_equal(a, b)
                for a, b in zip(model[:num_encoder], first[:num_encoder])
            ):
                group.append(n)
                break
        else:
            groups.append([n])
    return groups


def client_probabilities(
    backend, pool: Sequence[list[np.ndarray]], cluster_ids: np.ndarray, data: ClientArrays
) -> np.ndarray:
    """``(K, n, classes)``: each client's class probabilities from its own cluster model."""
    probs: np.ndarray | None = None
    for n in np.unique(cluster_ids):
        members = np.flatnonzero(cluster_ids == n)
        images = data.images[members].reshape(-1, *data.images.shape[2:])
        logits = backend.logits(pool[n], images)
        p = np.exp(logits - _logsumexp(logits))
        if probs is None:
            probs = np.empty((data.num_clients, data.size, p.shape[-1]), np.float32)
        probs[members] = p.reshape(len(members), data.size, -1)
    if probs is None:
        raise ValueError("no client to score")
    return probs


def _logsumexp(logits: np.ndarray) -> np.ndarray:
    top = logits.max(axis=-1, keepdims=True)
    return top + np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
