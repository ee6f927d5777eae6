"""SimSiam (Chen and He, CVPR 2021; the paper's Sec. "SimSiam"): shared encoder and
projector, a predictor, and a stop-gradient on the other view's projection."""

from __future__ import annotations

import tensorflow as tf

from cpcfl_tf.models import build_predictor, build_projector
from cpcfl_tf.pretraining.losses import simsiam_loss
from cpcfl_tf.pretraining.model import ContrastiveModel, Parts, predicted


def symmetric_simsiam(p1, p2, z1, z2):
    """SimSiam's symmetrised loss, D(p1, sg(z2))/2 + D(p2, sg(z1))/2 (Chen & He 2021)."""
    return 0.5 * (simsiam_loss(p1, tf.stop_gradient(z2)) + simsiam_loss(p2, tf.stop_gradient(z1)))


class SimSiam(ContrastiveModel):
    """Shared encoder + projector, predictor, stop-gradient."""

    def __init__(self, encoder, augmenter, projector, predictor, **kwargs):
        super().__init__(encoder, augmenter, **kwargs)
        self.projector, self.predictor = projector, predictor

    @property
    def online_parts(self):
        return [self.encoder, self.projector, self.predictor]

    def contrastive_loss(self, view1, view2):
        (p1, z1), (p2, z2) = predicted(self, view1), predicted(self, view2)
        return symmetric_simsiam(p1, p2, z1, z2), z1


def build(parts: Parts, settings: dict) -> SimSiam:
    # Sec. "Experimental settings": configured as BYOL's (512, bottleneck 64).
    width = settings["projector_dim"] or 512
    return SimSiam(
        parts.encoder,
        parts.augmenter,
        build_projector("bn", parts.dim, width=width),
        build_predictor(width, bottleneck=settings["predictor_dim"]),
        name="simsiam",
    )
