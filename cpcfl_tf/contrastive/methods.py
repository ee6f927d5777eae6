"""SimCLR, BYOL and SimSiam as ``keras.Model`` subclasses with a custom ``train_step``.

Each model owns an encoder, the augmenter that makes two views of every image, and the
method's extra parts (projector, predictor, target branch). ``train_step`` takes a batch
of ``uint8`` images (labels never exist here) and returns ``{metric.name: value}``: the
loss and the collapse monitor :func:`~cpcfl_tf.contrastive.losses.embedding_std`.

Table tab:different_url of the paper:

========= ========= ========= ============ ========== ========= ========
method    positives negatives weight share projector  predictor stop-grad
========= ========= ========= ============ ========== ========= ========
SimCLR    yes       yes       yes          yes        no        no
BYOL      yes       no        no (EMA)     yes        yes       yes
SimSiam   yes       no        yes          yes        yes       yes
========= ========= ========= ============ ========== ========= ========
"""
from __future__ import annotations

import keras
import tensorflow as tf

from cpcfl_tf.contrastive.losses import (byol_loss, embedding_std, nt_xent_across_replicas,
                                         simsiam_loss)
from cpcfl_tf.data.images import to_float


def symmetric_byol(p1, p2, t1, t2):
    """BYOL's symmetrised loss: p1 predicts the target of view 2 and p2 that of view 1."""
    return byol_loss(p1, tf.stop_gradient(t2)) + byol_loss(p2, tf.stop_gradient(t1))


def symmetric_simsiam(p1, p2, z1, z2):
    """SimSiam's symmetrised loss, D(p1, sg(z2))/2 + D(p2, sg(z1))/2 (Chen & He 2021)."""
    return 0.5 * (simsiam_loss(p1, tf.stop_gradient(z2)) + simsiam_loss(p2, tf.stop_gradient(z1)))


def _predicted(model, view):
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
        ``crop_and_resize`` has no XLA kernel), the update is XLA-compiled if asked."""
        views = tf.function(self.views, jit_compile=False)
        update = tf.function(self.update, jit_compile=jit_compile)
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
            view1, view2 = (v[index * share:(index + 1) * share] for v in (view1, view2))
            with tf.GradientTape() as tape:
                loss, z = self.contrastive_loss(view1, view2)
                scaled = self.optimizer.scale_loss(loss / replicas)
            variables = self.online_variables
            self.optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
            return loss, embedding_std(z)

        @tf.function(jit_compile=False)
        def step(images):
            view1, view2 = self.views(images)
            loss, std = strategy.run(replica_update, args=(view1, view2))
            self.after_step()
            mean = tf.distribute.ReduceOp.MEAN
            return {"loss": strategy.reduce(mean, loss, axis=None),
                    "embedding_std": strategy.reduce(mean, std, axis=None)}

        return step

    def after_step(self) -> None:
        """Hook after the optimizer step (BYOL's target update)."""
        return None

    def call(self, images, training=False):
        return self.encoder(to_float(images), training=training)


class SimCLR(ContrastiveModel):
    """SimCLR (Sec. "SimCLR"): shared encoder + projector, NT-Xent with temperature tau."""

    def __init__(self, encoder, augmenter, projector, temperature: float = 0.1, **kwargs):
        super().__init__(encoder, augmenter, **kwargs)
        self.projector = projector
        self.temperature = temperature

    @property
    def online_parts(self):
        return [self.encoder, self.projector]

    def contrastive_loss(self, view1, view2):
        # Both views in one pass: NT-Xent compares all 2B projections anyway.
        z = self.projector(self.encoder(tf.concat([view1, view2], 0), training=True),
                           training=True)
        z1, z2 = tf.split(z, 2)
        return nt_xent_across_replicas(z1, z2, self.temperature), z1


class BYOL(ContrastiveModel):
    """BYOL (Sec. "BYOL"): online encoder/projector/predictor, EMA target without gradient.

    The target branch is built by the same factories and starts as a copy of the online
    one. It stays ``trainable=True`` on purpose: ``trainable=False`` would switch its
    BatchNormalization to inference mode. It gets no gradient because the loss stops
    it, and no optimizer slots because the optimizer only sees :attr:`online_parts`.
    After each step its weights become ``beta * target + (1 - beta) * online``; its
    BatchNormalization statistics follow its own forward passes.
    """

    def __init__(self, encoder, augmenter, projector, predictor, target_encoder,
                 target_projector, target_decay: float = 0.9, **kwargs):
        super().__init__(encoder, augmenter, **kwargs)
        self.projector, self.predictor = projector, predictor
        self.target_encoder, self.target_projector = target_encoder, target_projector
        self.target_decay = target_decay
        for target, online in self._pairs():
            target.set_weights(online.get_weights())

    def _pairs(self):
        return [(self.target_encoder, self.encoder), (self.target_projector, self.projector)]

    @property
    def online_parts(self):
        return [self.encoder, self.projector, self.predictor]

    def _target(self, view):
        return self.target_projector(self.target_encoder(view, training=True), training=True)

    def contrastive_loss(self, view1, view2):
        (p1, z1), (p2, _) = _predicted(self, view1), _predicted(self, view2)
        return symmetric_byol(p1, p2, self._target(view1), self._target(view2)), z1

    def after_step(self):
        beta = self.target_decay
        for target, online in self._pairs():
            for t, o in zip(target.trainable_variables, online.trainable_variables):
                t.assign(beta * t + (1.0 - beta) * o)


class SimSiam(ContrastiveModel):
    """SimSiam (Sec. "SimSiam"): shared encoder + projector, predictor, stop-gradient."""

    def __init__(self, encoder, augmenter, projector, predictor, **kwargs):
        super().__init__(encoder, augmenter, **kwargs)
        self.projector, self.predictor = projector, predictor

    @property
    def online_parts(self):
        return [self.encoder, self.projector, self.predictor]

    def contrastive_loss(self, view1, view2):
        (p1, z1), (p2, z2) = _predicted(self, view1), _predicted(self, view2)
        return symmetric_simsiam(p1, p2, z1, z2), z1
