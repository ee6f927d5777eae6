"""How clients compute: losses for selection, local training, test predictions.

Two backends with one interface, so the rounds in :mod:`cpcfl_tf.federated.simulator`
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
fresh state per client per round, cross-entropy. ``encoder_epochs`` says in which of the
E epochs the encoder trains (all, none during ``t < Tc``, the first E_l,f otherwise).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

from cpcfl_tf.data.images import to_float

Stacked = list[np.ndarray]
"""Weights of many models, array by array, each with a leading model/client axis."""

_B1, _B2, _EPS = 0.9, 0.999, 1e-7  # Keras Adam defaults


@dataclasses.dataclass(frozen=True)
class ClientArrays:
    """Equal-sized client datasets stacked: ``images (K, n, h, w, 3)`` uint8, ``labels (K, n)``."""

    images: np.ndarray
    labels: np.ndarray

    @property
    def num_clients(self) -> int:
        return self.labels.shape[0]

    @property
    def size(self) -> int:
        return self.labels.shape[1]

    def subset(self, clients: np.ndarray) -> "ClientArrays":
        return ClientArrays(self.images[clients], self.labels[clients])


def batch_orders(num_clients: int, size: int, epochs: int, seed_words: Sequence[int]) -> np.ndarray:
    """``(epochs, clients, size)`` shuffles of each client's examples, one per epoch.

    Drawn from a generator seeded by ``seed_words`` (run seed, round, ...) so a resumed
    run replays exactly the batches of an uninterrupted one.
    """
    rng = np.random.default_rng(list(seed_words))
    return np.stack([np.stack([rng.permutation(size) for _ in range(num_clients)])
                     for _ in range(epochs)]).astype(np.int32)


def stack_models(models: Sequence[list[np.ndarray]]) -> Stacked:
    return [np.stack(arrays) for arrays in zip(*models)]


def unstack(stacked: Stacked, index: int) -> list[np.ndarray]:
    return [a[index] for a in stacked]


def _adam_alpha(learning_rate: float, step: int) -> float:
    return learning_rate * np.sqrt(1 - _B2 ** step) / (1 - _B1 ** step)


# --------------------------------------------------------------------------- stacked

@dataclasses.dataclass(frozen=True)
class _Layer:
    kind: str  # conv | flatten | dense
    activation: str = "linear"
    strides: tuple[int, int] = (1, 1)
    padding: str = "VALID"


def stackable_layers(classifier: keras.Model) -> list[_Layer] | None:
    """The classifier as a list of conv/flatten/dense steps, or ``None`` if it has other
    layers (then use :class:`KerasBackend`)."""
    steps = []
    for part in ("encoder", "head"):
        for layer in classifier.get_layer(part).layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            act = getattr(layer, "activation", None)
            act = act.__name__ if act is not None else "linear"
            if isinstance(layer, keras.layers.Conv2D) and type(layer) is keras.layers.Conv2D:
                if (layer.groups != 1 or tuple(layer.dilation_rate) != (1, 1)
                        or layer.data_format != "channels_last" or not layer.use_bias):
                    return None
                steps.append(_Layer("conv", act, tuple(layer.strides), layer.padding.upper()))
            elif isinstance(layer, keras.layers.Flatten):
                steps.append(_Layer("flatten"))
            elif isinstance(layer, keras.layers.Dense) and layer.use_bias:
                steps.append(_Layer("dense", act))
            else:
                return None
            if act not in ("relu", "linear", "softmax"):
                return None
    return steps if steps and steps[-1].kind == "dense" else None


def stacked_logits(layers: Sequence[_Layer], params: Sequence[tf.Tensor], x: tf.Tensor) -> tf.Tensor:
    """Logits of K models on their own inputs: ``x (K, B, h, w, c)`` -> ``(K, B, classes)``.

    K must be static. Convolutions run per client in the one graph (on a CPU that is as
    fast as one big batch with shared weights, and ~2.5x faster than a grouped
    convolution); dense layers run as one batched matmul. The last layer's softmax is
    left out: losses and predictions apply it.
    """
    k = x.shape[0]
    h, i = tf.unstack(x, num=k), 0
    for n, layer in enumerate(layers):
        last = n == len(layers) - 1
        if layer.kind == "flatten":
            h = tf.stack([tf.reshape(hk, [tf.shape(hk)[0], -1]) for hk in h])  # (K, B, features)
            continue
        kernel, bias = params[i], params[i + 1]
        i += 2
        if layer.kind == "conv":
            if not isinstance(h, list):
                raise ValueError("stacked models need their convolutions before any Flatten")
            # unstack, not kernel[c]: a slice's gradient is a full-size scatter per client
            kernels, biases = tf.unstack(kernel, num=k), tf.unstack(bias, num=k)
            h = [tf.nn.conv2d(hk, kc, layer.strides, layer.padding) + bc
                 for hk, kc, bc in zip(h, kernels, biases)]
            h = [_activate(hk, layer.activation, last) for hk in h]
        else:
            if isinstance(h, list):
                raise ValueError("stacked models need a Flatten before their first Dense")
            h = _activate(tf.einsum("kbi,kio->kbo", h, kernel) + bias[:, None, :],
                          layer.activation, last)
    return h


def _activate(h, activation: str, last: bool):
    if activation == "relu":
        return tf.nn.relu(h)
    if activation == "softmax" and not last:
        return tf.nn.softmax(h)
    return h


class StackedBackend:
    """All clients in one compiled step (see the module docstring)."""

    def __init__(self, classifier: keras.Model, *, eval_batch: int = 1024):
        layers = stackable_layers(classifier)
        if layers is None:
            raise ValueError(f"{classifier.name} has layers the stacked backend cannot run")
        self.layers = layers
        self.num_encoder = len(classifier.get_layer("encoder").weights)
        self.eval_batch = eval_batch
        # No reduce_retracing: the client axis K must stay static (one trace per K and
        # batch size, a handful per run).
        self._grads = tf.function(self._gradients)
        # Adam over K stacked copies is pure elementwise work: XLA fuses it into one pass
        # (2.4x faster than the op-by-op update on a CPU).
        self._adam = tf.function(_adam_update, jit_compile=True)
        self._logits = tf.function(
            lambda params, x: stacked_logits(self.layers, params, to_float(x)))

    def _gradients(self, params, images, labels, first: int):
        with tf.GradientTape() as tape:
            tape.watch(params[first:])
            logits = stacked_logits(self.layers, params, to_float(images))
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            loss = tf.reduce_sum(tf.reduce_mean(per_example, axis=1))  # each client's own mean
        return tape.gradient(loss, params[first:])

    def train(self, pool: Stacked, ids: np.ndarray, data: ClientArrays, orders: np.ndarray,
              encoder_epochs: Sequence[bool], *, batch_size: int, learning_rate: float) -> Stacked:
        """Train client u from model ``ids[u]`` of the stacked ``pool``; returns the
        clients' weights, stacked."""
        index = tf.constant(ids)
        params = [tf.gather(tf.constant(a), index) for a in pool]
        m = [tf.zeros_like(p) for p in params]
        v = [tf.zeros_like(p) for p in params]
        images, labels = tf.constant(data.images), tf.constant(data.labels)
        step = 0
        for epoch, order in enumerate(orders):
            first = 0 if encoder_epochs[epoch] else self.num_encoder
            for lo in range(0, data.size, batch_size):
                idx = tf.constant(order[:, lo:lo + batch_size])
                step += 1
                grads = self._grads(params, tf.gather(images, idx, batch_dims=1),
                                    tf.gather(labels, idx, batch_dims=1), first)
                alpha = tf.constant(_adam_alpha(learning_rate, step), tf.float32)
                params[first:], m[first:], v[first:] = self._adam(
                    params[first:], m[first:], v[first:], list(grads), alpha)
        return [p.numpy() for p in params]

    def logits(self, model: list[np.ndarray], images: np.ndarray) -> np.ndarray:
        """Logits of one model on ``images (n, h, w, 3)``, in chunks."""
        params = [tf.constant(a[None]) for a in model]
        return np.concatenate([
            self._logits(params, tf.constant(images[None, lo:lo + self.eval_batch]))[0].numpy()
            for lo in range(0, len(images), self.eval_batch)])


def _adam_update(params, m, v, grads, alpha):
    """Keras' Adam step (same formula and defaults), for lists of stacked tensors."""
    new_p, new_m, new_v = [], [], []
    for p, mp, vp, g in zip(params, m, v, grads):
        mp = mp + (g - mp) * (1 - _B1)
        vp = vp + (tf.square(g) - vp) * (1 - _B2)
        new_p.append(p - alpha * mp / (tf.sqrt(vp) + _EPS))
        new_m.append(mp)
        new_v.append(vp)
    return new_p, new_m, new_v


# --------------------------------------------------------------------------- keras

class KerasBackend:
    """Clients one by one on a single Keras classifier with swapped-in weights."""

    def __init__(self, classifier: keras.Model, *, eval_batch: int = 512):
        self.model = classifier
        self.num_encoder = len(classifier.get_layer("encoder").weights)
        self.eval_batch = eval_batch
        self.optimizer = keras.optimizers.Adam(1e-3)
        self.optimizer.build(classifier.trainable_variables)
        # Adam's moments and step count, reset per client (not its learning rate).
        self._adam_state = [v for v in self.optimizer.variables if "learning_rate" not in v.path]
        head = classifier.get_layer("head").trainable_variables
        self._steps = {True: tf.function(self._make_step(classifier.trainable_variables)),
                       False: tf.function(self._make_step(head))}
        self._forward = tf.function(lambda x: classifier(to_float(x), training=False),
                                    reduce_retracing=True)

    def _make_step(self, variables):
        def step(images, labels):
            with tf.GradientTape() as tape:
                probs = self.model(to_float(images), training=True)
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, probs))
            self.optimizer.apply(tape.gradient(loss, variables), variables)
            return loss
        return step

    def train(self, pool: Stacked, ids: np.ndarray, data: ClientArrays, orders: np.ndarray,
              encoder_epochs: Sequence[bool], *, batch_size: int, learning_rate: float) -> Stacked:
        self.optimizer.learning_rate.assign(learning_rate)
        trained = []
        for u in range(data.num_clients):
            self.model.set_weights(unstack(pool, ids[u]))
            for var in self._adam_state:  # fresh Adam state per client
                var.assign(tf.zeros_like(var))
            for epoch, order in enumerate(orders):
                for lo in range(0, data.size, batch_size):
                    idx = order[u, lo:lo + batch_size]
                    self._steps[bool(encoder_epochs[epoch])](
                        tf.constant(data.images[u, idx]), tf.constant(data.labels[u, idx]))
            trained.append(self.model.get_weights())
        return stack_models(trained)

    def logits(self, model: list[np.ndarray], images: np.ndarray) -> np.ndarray:
        self.model.set_weights(model)
        probs = np.concatenate([self._forward(tf.constant(images[lo:lo + self.eval_batch])).numpy()
                                for lo in range(0, len(images), self.eval_batch)])
        return np.log(np.clip(probs, 1e-12, None))


_STACKED: dict[tuple, StackedBackend] = {}


def make_backend(classifier: keras.Model, kind: str = "auto"):
    """``stacked`` when the classifier allows it (``auto``), else ``keras``.

    A stacked backend holds no weights, only compiled steps, so runs of the same
    architecture share one (tracing the K-client step costs seconds per run).
    """
    layers = stackable_layers(classifier)
    if kind == "keras" or (kind == "auto" and layers is None):
        return KerasBackend(classifier)
    key = (tuple(layers), tuple(tuple(w.shape) for w in classifier.weights),
           len(classifier.get_layer("encoder").weights))
    if key not in _STACKED:
        _STACKED[key] = StackedBackend(classifier)
    return _STACKED[key]


# ------------------------------------------------------------- shared by both backends

def client_losses(backend, pool: Sequence[list[np.ndarray]], data: ClientArrays) -> np.ndarray:
    """``(K, N)``: mean cross-entropy of every pool model on each client's data."""
    flat = data.images.reshape(-1, *data.images.shape[2:])
    labels = data.labels.reshape(-1)
    out = np.empty((data.num_clients, len(pool)))
    for n, model in enumerate(pool):
        logits = backend.logits(model, flat)
        logp = logits - _logsumexp(logits)
        out[:, n] = -logp[np.arange(len(labels)), labels].reshape(data.labels.shape).mean(axis=1)
    return out


def client_probabilities(backend, pool: Sequence[list[np.ndarray]], cluster_ids: np.ndarray,
                         data: ClientArrays) -> np.ndarray:
    """``(K, n, classes)``: each client's class probabilities from its own cluster model."""
    probs = None
    for n in np.unique(cluster_ids):
        members = np.flatnonzero(cluster_ids == n)
        images = data.images[members].reshape(-1, *data.images.shape[2:])
        logits = backend.logits(pool[n], images)
        p = np.exp(logits - _logsumexp(logits))
        if probs is None:
            probs = np.empty((data.num_clients, data.size, p.shape[-1]), np.float32)
        probs[members] = p.reshape(len(members), data.size, -1)
    return probs


def _logsumexp(logits: np.ndarray) -> np.ndarray:
    top = logits.max(axis=-1, keepdims=True)
    return top + np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
