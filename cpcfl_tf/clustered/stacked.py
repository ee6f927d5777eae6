"""The stacked backend: all clients in one compiled step (:mod:`cpcfl_tf.clustered.backends`
says when it runs). Their weights are stacked on a leading client axis; each client's
convolutions are separate ops of one graph and dense layers one batched matmul; Adam is
elementwise, so a step is exactly K independent local trainings."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from cpcfl_tf.clustered.clients import ClientArrays
from cpcfl_tf.clustered.local import (
    B1,
    B2,
    EPS,
    HEAD,
    ClientMoments,
    LocalTraining,
    Stacked,
    adam_alpha,
    trained_arrays,
)
from cpcfl_tf.data.images import to_float


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
                if (
                    layer.groups != 1
                    or tuple(layer.dilation_rate) != (1, 1)
                    or layer.data_format != "channels_last"
                    or not layer.use_bias
                ):
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


def stacked_logits(
    layers: Sequence[_Layer], params: Sequence[tf.Tensor], x: tf.Tensor
) -> tf.Tensor:
    """Logits of K models on their own inputs: ``x (K, B, h, w, c)`` -> ``(K, B, classes)``.

    K must be static. Convolutions run per client in the one graph (on a CPU that is as
    fast as one big batch with shared weights, and faster than one grouped convolution
    for all clients: ``benchmarks/speed_study.py``); dense layers run as one batched
    matmul. Images ``(K, B, h, w, c)`` or features ``(K, B, d)`` (a head's input). The
    last layer's softmax is left out: losses and predictions apply it.
    """
    k = x.shape[0]
    # Images (K, B, h, w, c) go through convolutions per client; features (K, B, d),
    # e.g. a frozen encoder's into a head, straight into the dense layers.
    h, i = (tf.unstack(x, num=k) if x.shape.rank == 5 else x), 0
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
            h = [
                tf.nn.conv2d(hk, kc, layer.strides, layer.padding) + bc
                for hk, kc, bc in zip(h, kernels, biases)
            ]
            h = [_activate(hk, layer.activation, last) for hk in h]
        else:
            if isinstance(h, list):
                raise ValueError("stacked models need a Flatten before their first Dense")
            h = _activate(
                tf.einsum("kbi,kio->kbo", h, kernel) + bias[:, None, :], layer.activation, last
            )
    return h


def _activate(h, activation: str, last: bool):
    if activation == "relu":
        return tf.nn.relu(h)
    if activation == "softmax" and not last:
        return tf.nn.softmax(h)
    return h


class StackedBackend:
    """All clients in one compiled step (see the module docstring)."""

    def __init__(
        self, classifier: keras.Model, *, eval_batch: int = 1024, jit_compile: bool = False
    ):
        layers = stackable_layers(classifier)
        if layers is None:
            raise ValueError(f"{classifier.name} has layers the stacked backend cannot run")
        self.layers = layers
        self.num_encoder = len(classifier.get_layer("encoder").weights)
        # The encoder's steps and the head's (stackable_layers makes one per layer).
        split = sum(
            not isinstance(layer, keras.layers.InputLayer)
            for layer in classifier.get_layer("encoder").layers
        )
        self.encoder_layers, self.head_layers = layers[:split], layers[split:]
        self.eval_batch = eval_batch
        # No reduce_retracing: the client axis K must stay static (one trace per K and
        # batch size, a handful per run). jit_compile: federated.jit_compile. No AutoGraph
        # (here and in every step of the kit): no Python control flow over tensors.
        self._grads = tf.function(self._gradients, jit_compile=jit_compile, autograph=False)
        # federated.frozen_features: a frozen encoder's features, then the head's steps.
        self._features = tf.function(
            lambda params, x: stacked_logits(self.encoder_layers, params, to_float(x)),
            autograph=False,
        )
        self._head_grads = tf.function(
            self._head_gradients, jit_compile=jit_compile, autograph=False
        )
        # Adam over K stacked copies is pure elementwise work: XLA fuses it into one pass
        # (2.4x faster than the op-by-op update on a CPU).
        self._adam = tf.function(_adam_update, jit_compile=True, autograph=False)
        self._sgd = tf.function(_sgd_update, jit_compile=True, autograph=False)
        self._proximal = tf.function(_proximal, jit_compile=True, autograph=False)
        # The forward pass (selection, evaluation) stays op by op: XLA was no faster there
        # (0.76 against 0.74 s for 3 models on 3,000 images, 2-core EPYC). Its number of
        # images is left open in one trace: a cluster's test images change in number
        # every round of the Tc phase, and each new number was a new trace (TensorFlow's
        # retracing warning). Measured on a 2-core EPYC: the same logits to the bit as
        # per-shape traces, at the same speed.
        signature = [
            [tf.TensorSpec((1, *w.shape), w.dtype) for w in classifier.weights],
            tf.TensorSpec((1, None, *classifier.input_shape[1:]), tf.uint8),
        ]
        self._logits = tf.function(
            lambda params, x: stacked_logits(self.layers, params, to_float(x)),
            input_signature=signature,
            autograph=False,
        )
        weights, k = signature[0], self.num_encoder
        self._encode = tf.function(
            lambda params, x: stacked_logits(self.encoder_layers, params, to_float(x)),
            input_signature=[weights[:k], signature[1]],
            autograph=False,
        )
        width = classifier.get_layer("encoder").output_shape[-1]
        self._head = tf.function(
            lambda params, f: stacked_logits(self.head_layers, params, f),
            input_signature=[weights[k:], tf.TensorSpec((1, None, width), tf.float32)],
            autograph=False,
        )

    def _gradients(self, params, images, labels, first: int, last: int | None = None):
        with tf.GradientTape() as tape:
            tape.watch(params[first:last])
            loss = _clients_loss(stacked_logits(self.layers, params, to_float(images)), labels)
        return tape.gradient(loss, params[first:last])

    def _head_gradients(self, head, features, labels):
        with tf.GradientTape() as tape:
            tape.watch(head)
            loss = _clients_loss(stacked_logits(self.head_layers, head, features), labels)
        return tape.gradient(loss, head)

    def frozen_features(
        self, encoder: Sequence[tf.Tensor], images: tf.Tensor, batch_size: int
    ) -> tf.Tensor:
        """``(K, n, d)``: each client's images ``(K, n, h, w, c)`` through its own
        (frozen) encoder, in the order given, ``batch_size`` images a client at a time."""
        return tf.concat(
            [
                self._features(list(encoder), images[:, lo : lo + batch_size])
                for lo in range(0, images.shape[1], batch_size)
            ],
            axis=1,
        )

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
        """Train client u from model ``ids[u]`` of the stacked ``pool``, each epoch the
        part ``epochs`` names (:data:`~cpcfl_tf.clustered.local.MODEL`, ...); returns the
        clients' weights, stacked. With ``moments`` (of exactly these clients) Adam starts
        from and updates them; otherwise its state is fresh. ``anchor``: the one model
        ``local.prox`` pulls every client towards. Every client in one step (the
        simulator bounds how many it passes: ``--max-clients-per-step``)."""
        return self._train(pool, ids, data, orders, epochs, local, moments, anchor)

    def _train(
        self,
        pool: Stacked,
        ids: np.ndarray,
        data: ClientArrays,
        orders: np.ndarray,
        epochs: Sequence[str],
        local: LocalTraining,
        moments: ClientMoments | None,
        anchor: Sequence[np.ndarray] | None = None,
    ) -> Stacked:
        if local.prox and anchor is None:
            raise ValueError("local.prox pulls towards an anchor model: pass it")
        anchors = [tf.constant(a[None]) for a in anchor] if local.prox and anchor else None
        index = tf.constant(ids)
        params = [tf.gather(tf.constant(a), index) for a in pool]
        steps: int | np.ndarray
        if moments is None:
            m = [tf.zeros_like(p) for p in params]
            v = [tf.zeros_like(p) for p in params]
            steps = 0
        else:
            m, v = [tf.constant(a) for a in moments.m], [tf.constant(a) for a in moments.v]
            steps = moments.steps.copy()
        images, labels = tf.constant(data.images), tf.constant(data.labels)
        features = None  # federated.frozen_features: of the encoder as it is frozen
        for epoch, order in enumerate(orders):
            trained = trained_arrays(epochs[epoch], self.num_encoder)
            first, last = trained.start, trained.stop
            if epochs[epoch] != HEAD:
                features = None
            elif local.frozen_features and features is None:
                features = self.frozen_features(params[:first], images, local.batch_size)
            for lo in range(0, data.size, local.batch_size):
                idx = tf.constant(order[:, lo : lo + local.batch_size])
                batch_labels = tf.gather(labels, idx, batch_dims=1)
                if features is not None:
                    grads = self._head_grads(
                        params[first:], tf.gather(features, idx, batch_dims=1), batch_labels
                    )
                else:
                    grads = self._grads(
                        params, tf.gather(images, idx, batch_dims=1), batch_labels, first, last
                    )
                if anchors is not None:  # the gradient of lambda / 2 * ||w - anchor||^2
                    grads = self._proximal(
                        list(grads),
                        params[first:last],
                        anchors[first:last],
                        tf.constant(local.prox, tf.float32),
                    )
                if local.optimizer == "sgd":
                    params[first:last] = self._sgd(
                        params[first:last],
                        list(grads),
                        tf.constant(local.learning_rate, tf.float32),
                    )
                    continue
                steps = steps + 1
                # A fresh state gives every client the same step count, so one scalar
                # step size (the graph of before); kept states give one per client.
                alpha = tf.constant(adam_alpha(local.learning_rate, steps), tf.float32)
                params[first:last], m[first:last], v[first:last] = self._adam(
                    params[first:last], m[first:last], v[first:last], list(grads), alpha
                )
        if moments is not None:
            moments.m, moments.v = [a.numpy() for a in m], [a.numpy() for a in v]
            moments.steps = np.asarray(steps)  # one count per client, kept
        return [p.numpy() for p in params]

    def logits(self, model: list[np.ndarray], images: np.ndarray) -> np.ndarray:
        """Logits of one model on ``images (n, h, w, 3)``, in chunks."""
        return self._in_chunks(self._logits, model, images)

    def features(self, encoder: list[np.ndarray], images: np.ndarray) -> np.ndarray:
        """``(n, d)``: an encoder's features of ``images``, in the chunks of :meth:`logits`;
        ``head_logits(head, features(encoder, x))`` is ``logits(encoder + head, x)`` to
        the bit (tested), so models that share an encoder share its pass."""
        return self._in_chunks(self._encode, encoder, images)

    def head_logits(self, head: list[np.ndarray], features: np.ndarray) -> np.ndarray:
        """Logits of a head on :meth:`features`."""
        return self._in_chunks(self._head, head, features)

    def _in_chunks(self, step, weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
        """``step`` of one model's ``weights`` over ``x``, ``eval_batch`` rows at a time."""
        params = [tf.constant(a[None]) for a in weights]
        return np.concatenate(
            [
                step(params, tf.constant(x[None, lo : lo + self.eval_batch]))[0].numpy()
                for lo in range(0, len(x), self.eval_batch)
            ]
        )


def _clients_loss(logits, labels):
    """The sum over clients of each client's own mean cross-entropy."""
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    return tf.reduce_sum(tf.reduce_mean(per_example, axis=1))


def _adam_update(params, m, v, grads, alpha):
    """Keras' Adam step (same formula and defaults), for lists of stacked tensors."""
    new_p, new_m, new_v = [], [], []
    for p, mp, vp, g in zip(params, m, v, grads):
        mp = mp + (g - mp) * (1 - B1)
        vp = vp + (tf.square(g) - vp) * (1 - B2)
        a = alpha if alpha.shape.rank == 0 else tf.reshape(alpha, [-1] + [1] * (p.shape.rank - 1))
        new_p.append(p - a * mp / (tf.sqrt(vp) + EPS))
        new_m.append(mp)
        new_v.append(vp)
    return new_p, new_m, new_v


def _sgd_update(params, grads, learning_rate):
    return [p - learning_rate * g for p, g in zip(params, grads)]


def _proximal(grads, params, anchors, lam):
    """``grads`` plus the gradient of ``lam / 2 * ||params - anchors||^2`` (each anchor
    ``(1, ...)``, the same model for every client)."""
    return [g + lam * (p - a) for g, p, a in zip(grads, params, anchors)]
