"""What every self-supervised method shares: a ``keras.Model`` with two augmented views,
one optimizer step and its metrics (:class:`ContrastiveModel`), and the parts a method's
``build`` gets (:class:`Parts`).

Each method is one module beside this one (``simclr``, ``byol``, ``simsiam``, ``vicreg``)
holding its model and a ``build(parts, settings)`` that the registry
(:mod:`cpcfl_tf.methods.ssl`) calls. ``train_step`` takes a batch of ``uint8`` images
(labels never exist here) and returns ``{metric.name: value}``: the loss and the collapse
monitor :func:`~cpcfl_tf.pretraining.losses.embedding_std`.

Table tab:different_url of the paper:

========= ========= ========= ============ ========== ========= ========
method    positives negatives weight share projector  predictor stop-grad
========= ========= ========= ============ ========== ========= ========
SimCLR    yes       yes       yes          yes        no        no
BYOL      yes       no        no (EMA)     yes        yes       yes
SimSiam   yes       no        yes          yes        yes       yes
========= ========= ========= ============ ========== ========= ========

(VICReg, beyond the paper: no negatives, shared weights, an expander, no predictor, no
stop-gradient; variance and covariance terms keep it from collapsing.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import tensorflow as tf

from cpcfl_tf.data.images import to_float
from cpcfl_tf.pretraining.losses import embedding_std


@dataclasses.dataclass
class Parts:
    """What a method's ``build`` is given: the encoder and the augmenter, built and
    seeded, and what it needs to build the rest."""

    encoder: keras.Model
    augmenter: keras.Model
    encoder_name: str
    """``cnn``, ``resnet18``, ``resnet50``: a method may size its heads by it."""
    dim: int
    """Width of the encoder's output."""
    new_encoder: Callable[[str], keras.Model]
    """Another encoder of the same architecture, by Keras name (BYOL's target)."""
    total_steps: int = 1
    """Optimizer steps of the whole pre-training (schedules that run over it)."""


def predicted(model, view):
    """The online branch of BYOL and SimSiam: projection z and its prediction p."""
    z = model.projector(model.encoder(view, training=True), training=True)
    return model.predictor(z, training=True), z


class ContrastiveModel(keras.Model):
    """What the three methods share: two augmented views, one optimizer step, metrics.

    Subclasses define :meth:`contrastive_loss` (views -> loss, embeddings to monitor)
    and :attr:`online_parts` (the sub-models the optimizer trains).
    """

    def __init__(self, encoder: keras.Model, augmenter: keras.Model, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.augmenter = augmenter
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.std_tracker = keras.metrics.Mean(name="embedding_std")

    @property
    def metrics(self):
        return [self.loss_tracker, self.std_tracker]

    @property
    def online_parts(self) -> list[keras.Model]:
        raise NotImplementedError

    @property
    def online_variables(self) -> list:
        return [v for part in self.online_parts for v in part.trainable_variables]

    def contrastive_loss(self, view1, view2) -> tuple[tf.Tensor, tf.Tensor]:
        raise NotImplementedError

    def views(self, images):
        x = to_float(images)
        return self.augmenter(x, training=True), self.augmenter(x, training=True)

    def train_step(self, data):
        images = data[0] if isinstance(data, (tuple, list)) else data
        return self.update(*self.views(images))

    def update(self, view1, view2):
        """One optimizer step on two batches of views; returns the metrics."""
        with tf.GradientTape() as tape:
            loss, z = self.contrastive_loss(view1, view2)
            scaled = self.optimizer.scale_loss(loss)  # loss scaling under mixed_float16
        variables = self.online_variables
        self.optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
        self.after_step()
        self.loss_tracker.update_state(loss)
        self.std_tracker.update_state(embedding_std(z))
        return {m.name: m.result() for m in self.metrics}

    def make_step(self, jit_compile: bool):
        """``train_step`` as compiled functions: augmentation stays a TF graph (its
        ``crop_and_resize`` has no XLA kernel), the update is XLA-compiled if asked.
        No AutoGraph: a step has no Python control flow over tensors, so converting it
        (and every Keras layer it calls) changed nothing in the graph but took a third of
        the time to trace it."""
        views = tf.function(self.views, jit_compile=False, autograph=False)
        update = tf.function(self.update, jit_compile=jit_compile, autograph=False)
        return lambda images: update(*views(images))

    def make_mirrored_step(self, strategy: tf.distribute.Strategy):
        """``train_step`` under ``strategy`` (built in its scope): the views of the global
        batch are made once, each replica trains on its B/R share with the loss scaled
        by 1/R (gradients are summed over replicas), and BYOL's target update runs once
        in cross-replica context. SimCLR gathers its negatives across replicas and
        BatchNormalization is synchronised, so a step equals the single-device step."""
        replicas = strategy.num_replicas_in_sync

        def replica_update(view1, view2):
            index = tf.distribute.get_replica_context().replica_id_in_sync_group
            share = tf.shape(view1)[0] // replicas
            view1, view2 = (v[index * share : (index + 1) * share] for v in (view1, view2))
            with tf.GradientTape() as tape:
                loss, z = self.contrastive_loss(view1, view2)
                scaled = self.optimizer.scale_loss(loss / replicas)
            variables = self.online_variables
            self.optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
            return loss, embedding_std(z)

        @tf.function(jit_compile=False, autograph=False)
        def step(images):
            view1, view2 = self.views(images)
            loss, std = strategy.run(replica_update, args=(view1, view2))
            self.after_step()
            mean = tf.distribute.ReduceOp.MEAN
            return {
                "loss": strategy.reduce(mean, loss, axis=None),
                "embedding_std": strategy.reduce(mean, std, axis=None),
            }

        return step

    def after_step(self) -> None:
        """Hook after the optimizer step (BYOL's target update)."""
        return None

    def target_pairs(self) -> list[tuple[keras.Model, keras.Model]]:
        """``(target, online)`` sub-models of a moving-average target network (BYOL's);
        none for the others. A federated pre-training keeps the targets on the client."""
        return []

    def call(self, images, training=False):
        return self.encoder(to_float(images), training=training)
