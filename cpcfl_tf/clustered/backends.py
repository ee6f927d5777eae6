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
fresh state per client per round, cross-entropy. ``trains_encoder`` says in which of the
E epochs the encoder trains (all, none during ``t < Tc``, the first E_l,f otherwise). In
an epoch without it the encoder is *frozen* as Keras freezes a model: its weights,
BatchNormalization statistics included, do not change and it runs in inference mode,
so the head trains on the features that selection and evaluation see.

:class:`LocalTraining` says how a client trains (optimizer, learning rate, batch size);
:class:`ClientMoments` is the Adam state clients keep between rounds when
``optimizer_state="client"`` (the zig-zag study, ``experiments/local_optimizer.py``).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

from cpcfl_tf.data.images import to_float
from cpcfl_tf.errors import UserError
from cpcfl_tf.clustered.clients import ClientArrays

Stacked = list[np.ndarray]
"""Weights of many models, array by array, each with a leading model/client axis."""

_B1, _B2, _EPS = 0.9, 0.999, 1e-7  # Keras Adam defaults


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """How a client trains its model: the paper's is Adam 1e-3, batch 32."""

    batch_size: int = 32
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    """adam | sgd."""

    @classmethod
    def of(cls, fl) -> "LocalTraining":
        """The local training a :class:`~cpcfl_tf.config.FederatedConfig` names."""
        return cls(fl.batch_size, fl.learning_rate, fl.local_optimizer)


@dataclasses.dataclass
class ClientMoments:
    """Adam's first and second moments of every client, array by array (leading client
    axis), and each client's step count: the optimizer state a client keeps between
    rounds when ``optimizer_state="client"``."""

    m: Stacked
    v: Stacked
    steps: np.ndarray

    @classmethod
    def zeros(cls, model: Sequence[np.ndarray], num_clients: int) -> "ClientMoments":
        m = [np.zeros((num_clients, *a.shape), np.float32) for a in model]
        return cls(m, [a.copy() for a in m], np.zeros(num_clients, np.int64))

    def subset(self, clients: np.ndarray) -> "ClientMoments":
        return ClientMoments([a[clients] for a in self.m], [a[clients] for a in self.v],
                             self.steps[clients])

    def put(self, clients: np.ndarray, part: "ClientMoments") -> None:
        """Write back the state of ``clients`` after they trained."""
        for full, new in zip(self.m + self.v, part.m + part.v):
            full[clients] = new
        self.steps[clients] = part.steps

    def arrays(self) -> dict[str, np.ndarray]:
        """Named arrays, for a checkpoint."""
        return {"steps": self.steps, **{f"m{i}": a for i, a in enumerate(self.m)},
                **{f"v{i}": a for i, a in enumerate(self.v)}}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "ClientMoments":
        count = sum(1 for k in arrays if k.startswith("m"))
        return cls([arrays[f"m{i}"] for i in range(count)],
                   [arrays[f"v{i}"] for i in range(count)], arrays["steps"])


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

    def __init__(self, classifier: keras.Model, *, eval_batch: int = 1024,
                 jit_compile: bool = False):
        layers = stackable_layers(classifier)
        if layers is None:
            raise ValueError(f"{classifier.name} has layers the stacked backend cannot run")
        self.layers = layers
        self.num_encoder = len(classifier.get_layer("encoder").weights)
        self.eval_batch = eval_batch
        # No reduce_retracing: the client axis K must stay static (one trace per K and
        # batch size, a handful per run). jit_compile: federated.jit_compile.
        self._grads = tf.function(self._gradients, jit_compile=jit_compile)
        # Adam over K stacked copies is pure elementwise work: XLA fuses it into one pass
        # (2.4x faster than the op-by-op update on a CPU).
        self._adam = tf.function(_adam_update, jit_compile=True)
        self._sgd = tf.function(_sgd_update, jit_compile=True)
        # The forward pass (selection, evaluation) stays op by op: XLA was no faster there
        # (0.76 against 0.74 s for 3 models on 3,000 images, 2-core EPYC). Its number of
        # images is left open in one trace: a cluster's test images change in number
        # every round of the Tc phase, and each new number was a new trace (TensorFlow's
        # retracing warning). Measured on a 2-core EPYC: the same logits to the bit as
        # per-shape traces, at the same speed.
        signature = [[tf.TensorSpec((1, *w.shape), w.dtype) for w in classifier.weights],
                     tf.TensorSpec((1, None, *classifier.input_shape[1:]), tf.uint8)]
        self._logits = tf.function(
            lambda params, x: stacked_logits(self.layers, params, to_float(x)),
            input_signature=signature)

    def _gradients(self, params, images, labels, first: int):
        with tf.GradientTape() as tape:
            tape.watch(params[first:])
            logits = stacked_logits(self.layers, params, to_float(images))
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            loss = tf.reduce_sum(tf.reduce_mean(per_example, axis=1))  # each client's own mean
        return tape.gradient(loss, params[first:])

    def train(self, pool: Stacked, ids: np.ndarray, data: ClientArrays, orders: np.ndarray,
              trains_encoder: Sequence[bool], local: LocalTraining,
              moments: ClientMoments | None = None, *, max_clients: int | None = None
              ) -> Stacked:
        """Train client u from model ``ids[u]`` of the stacked ``pool``; returns the
        clients' weights, stacked. With ``moments`` (of exactly these clients) Adam starts
        from and updates them; otherwise its state is fresh. ``max_clients`` bounds how
        many clients one step holds (memory: weights and Adam state of that many models);
        the clients are independent, so chunks give the unchunked result."""
        count = len(ids)
        if max_clients is None or count <= max_clients:
            return self._train(pool, ids, data, orders, trains_encoder, local, moments)
        parts = []
        for lo in range(0, count, max_clients):
            rows = np.arange(lo, min(lo + max_clients, count))
            own = None if moments is None else moments.subset(rows)
            parts.append(self._train(pool, ids[rows], data.subset(rows), orders[:, rows],
                                     trains_encoder, local, own))
            if own is not None:
                moments.put(rows, own)
        return [np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]

    def _train(self, pool: Stacked, ids: np.ndarray, data: ClientArrays, orders: np.ndarray,
               trains_encoder: Sequence[bool], local: LocalTraining,
               moments: ClientMoments | None) -> Stacked:
        index = tf.constant(ids)
        params = [tf.gather(tf.constant(a), index) for a in pool]
        if moments is None:
            m = [tf.zeros_like(p) for p in params]
            v = [tf.zeros_like(p) for p in params]
            steps = 0
        else:
            m, v = [tf.constant(a) for a in moments.m], [tf.constant(a) for a in moments.v]
            steps = moments.steps.copy()
        images, labels = tf.constant(data.images), tf.constant(data.labels)
        for epoch, order in enumerate(orders):
            first = 0 if trains_encoder[epoch] else self.num_encoder
            for lo in range(0, data.size, local.batch_size):
                idx = tf.constant(order[:, lo:lo + local.batch_size])
                grads = self._grads(params, tf.gather(images, idx, batch_dims=1),
                                    tf.gather(labels, idx, batch_dims=1), first)
                if local.optimizer == "sgd":
                    params[first:] = self._sgd(params[first:], list(grads),
                                               tf.constant(local.learning_rate, tf.float32))
                    continue
                steps = steps + 1
                # A fresh state gives every client the same step count, so one scalar
                # step size (the graph of before); kept states give one per client.
                alpha = tf.constant(_adam_alpha(local.learning_rate, steps), tf.float32)
                params[first:], m[first:], v[first:] = self._adam(
                    params[first:], m[first:], v[first:], list(grads), alpha)
        if moments is not None:
            moments.m, moments.v = [a.numpy() for a in m], [a.numpy() for a in v]
            moments.steps = steps
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
        a = alpha if alpha.shape.rank == 0 else tf.reshape(alpha, [-1] + [1] * (p.shape.rank - 1))
        new_p.append(p - a * mp / (tf.sqrt(vp) + _EPS))
        new_m.append(mp)
        new_v.append(vp)
    return new_p, new_m, new_v


def _sgd_update(params, grads, learning_rate):
    return [p - learning_rate * g for p, g in zip(params, grads)]


# --------------------------------------------------------------------------- keras

class KerasBackend:
    """Clients one by one on a single Keras classifier with swapped-in weights."""

    def __init__(self, classifier: keras.Model, *, eval_batch: int = 512,
                 jit_compile: bool = False):
        self.model = classifier
        self.num_encoder = len(classifier.get_layer("encoder").weights)
        self.eval_batch = eval_batch
        self.optimizers = {"adam": keras.optimizers.Adam(1e-3), "sgd": keras.optimizers.SGD(1e-3)}
        for optimizer in self.optimizers.values():
            optimizer.build(classifier.trainable_variables)
        self._steps = {(name, whole): tf.function(self._make_step(optimizer, whole),
                                                  jit_compile=jit_compile)
                       for name, optimizer in self.optimizers.items() for whole in (True, False)}
        self._forward = tf.function(lambda x: classifier(to_float(x), training=False),
                                    reduce_retracing=True)

    def _make_step(self, optimizer: keras.optimizers.Optimizer, train_encoder: bool):
        encoder, head = self.model.get_layer("encoder"), self.model.get_layer("head")
        variables = (self.model.trainable_variables if train_encoder
                     else head.trainable_variables)

        def step(images, labels):
            x = to_float(images)
            # A frozen encoder runs in inference mode (BatchNormalization uses and keeps
            # its moving statistics), as Keras runs a layer with trainable=False.
            features = None if train_encoder else encoder(x, training=False)
            with tf.GradientTape() as tape:
                probs = (self.model(x, training=True) if train_encoder
                         else head(features, training=True))
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, probs))
            optimizer.apply(tape.gradient(loss, variables), variables)
            return loss
        return step

    def train(self, pool: Stacked, ids: np.ndarray, data: ClientArrays, orders: np.ndarray,
              trains_encoder: Sequence[bool], local: LocalTraining,
              moments: ClientMoments | None = None, *, max_clients: int | None = None
              ) -> Stacked:
        del max_clients  # one client at a time already
        if moments is not None:
            raise UserError("federated.optimizer_state 'client' needs the stacked backend "
                            "(the CNN encoder); use optimizer_state fresh")
        optimizer = self.optimizers[local.optimizer]
        optimizer.learning_rate.assign(local.learning_rate)
        # The optimizer's state (moments, step count), reset per client; not its rate.
        state = [v for v in optimizer.variables if "learning_rate" not in v.path]
        trained = []
        for u in range(data.num_clients):
            self.model.set_weights(unstack(pool, ids[u]))
            for var in state:
                var.assign(tf.zeros_like(var))
            for epoch, order in enumerate(orders):
                step = self._steps[local.optimizer, bool(trains_encoder[epoch])]
                for lo in range(0, data.size, local.batch_size):
                    idx = order[u, lo:lo + local.batch_size]
                    step(tf.constant(data.images[u, idx]), tf.constant(data.labels[u, idx]))
            trained.append(self.model.get_weights())
        return stack_models(trained)

    def logits(self, model: list[np.ndarray], images: np.ndarray) -> np.ndarray:
        self.model.set_weights(model)
        probs = np.concatenate([self._forward(tf.constant(images[lo:lo + self.eval_batch])).numpy()
                                for lo in range(0, len(images), self.eval_batch)])
        return np.log(np.clip(probs, 1e-12, None))


_STACKED: dict[tuple, StackedBackend] = {}


def backend_of(classifier: keras.Model, fl) -> "StackedBackend | KerasBackend":
    """The backend a :class:`~cpcfl_tf.config.FederatedConfig` names (``backend``,
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
    key = (tuple(layers), tuple(tuple(w.shape) for w in classifier.weights),
           len(classifier.get_layer("encoder").weights), jit_compile)
    if key not in _STACKED:
        _STACKED[key] = StackedBackend(classifier, jit_compile=jit_compile)
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
