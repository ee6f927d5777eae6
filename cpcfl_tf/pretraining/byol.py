"""BYOL (Grill et al., NeurIPS 2020; the paper's Sec. "BYOL"): an online encoder,
projector and predictor, and a target branch that is their moving average."""

from __future__ import annotations

import math

import tensorflow as tf

from cpcfl_tf.models import build_predictor, build_projector
from cpcfl_tf.pretraining.losses import byol_loss
from cpcfl_tf.pretraining.model import ContrastiveModel, Parts, predicted


def symmetric_byol(p1, p2, t1, t2):
    """BYOL's symmetrised loss: p1 predicts the target of view 2 and p2 that of view 1."""
    return byol_loss(p1, tf.stop_gradient(t2)) + byol_loss(p2, tf.stop_gradient(t1))


def cosine_target_rate(base: float, step, total_steps: int):
    """BYOL's schedule of the target rate (its Sec. 3.2): ``1 - (1 - base) * (cos(pi k /
    K) + 1) / 2`` after step k of K, from ``base`` at the start to 1 at the end."""
    k = tf.cast(step, tf.float32)
    return 1.0 - (1.0 - base) * (tf.cos(math.pi * k / float(max(total_steps, 1))) + 1.0) / 2.0


class BYOL(ContrastiveModel):
    """Online encoder/projector/predictor, EMA target without gradient.

    The target branch is built by the same factories and starts as a copy of the online
    one. It stays ``trainable=True`` on purpose: ``trainable=False`` would switch its
    BatchNormalization to inference mode. It gets no gradient because the loss stops
    it, and no optimizer slots because the optimizer only sees :attr:`online_parts`.
    After each step its weights become ``beta * target + (1 - beta) * online``; its
    BatchNormalization statistics follow its own forward passes. ``target_schedule``
    ``cosine`` raises beta from ``target_decay`` to 1 over ``total_steps`` steps.
    """

    def __init__(
        self,
        encoder,
        augmenter,
        projector,
        predictor,
        target_encoder,
        target_projector,
        target_decay: float = 0.9,
        *,
        target_schedule: str = "constant",
        total_steps: int = 1,
        **kwargs,
    ):
        super().__init__(encoder, augmenter, **kwargs)
        self.projector, self.predictor = projector, predictor
        self.target_encoder, self.target_projector = target_encoder, target_projector
        self.target_decay = target_decay
        self.target_schedule, self.total_steps = target_schedule, total_steps
        for target, online in self.target_pairs():
            target.set_weights(online.get_weights())

    def target_pairs(self):
        return [(self.target_encoder, self.encoder), (self.target_projector, self.projector)]

    @property
    def online_parts(self):
        return [self.encoder, self.projector, self.predictor]

    def _target(self, view):
        return self.target_projector(self.target_encoder(view, training=True), training=True)

    def contrastive_loss(self, view1, view2):
        (p1, z1), (p2, _) = predicted(self, view1), predicted(self, view2)
        return symmetric_byol(p1, p2, self._target(view1), self._target(view2)), z1

    def target_rate(self):
        """beta of the step just taken (the optimizer has counted it already)."""
        if self.target_schedule == "constant":
            return self.target_decay
        return cosine_target_rate(
            self.target_decay, self.optimizer.iterations - 1, self.total_steps
        )

    def after_step(self):
        beta = self.target_rate()
        for target, online in self.target_pairs():
            for t, o in zip(target.trainable_variables, online.trainable_variables):
                t.assign(beta * t + (1.0 - beta) * o)


def build(parts: Parts, settings: dict) -> BYOL:
    # Sec. "Experimental settings": projector 512 -> 512 with BN, predictor 64 -> 512.
    width = settings["projector_dim"] or 512

    def projector(name):
        return build_projector("bn", parts.dim, width=width, model_name=name)

    return BYOL(
        parts.encoder,
        parts.augmenter,
        projector("projector"),
        build_predictor(width, bottleneck=settings["predictor_dim"]),
        parts.new_encoder("target_encoder"),
        projector("target_projector"),
        settings["target_decay"],
        target_schedule=settings["target_schedule"],
        total_steps=parts.total_steps,
        name="byol",
    )
