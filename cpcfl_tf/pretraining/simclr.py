"""SimCLR (Chen et al., ICML 2020; the paper's Sec. "SimCLR"): shared encoder and
projector, NT-Xent with temperature tau over the 2B views of a batch."""

from __future__ import annotations

import tensorflow as tf

from cpcfl_tf.models import build_projector
from cpcfl_tf.pretraining.losses import nt_xent_across_replicas
from cpcfl_tf.pretraining.model import ContrastiveModel, Parts


class SimCLR(ContrastiveModel):
    """Shared encoder + projector, NT-Xent with temperature tau."""

    def __init__(self, encoder, augmenter, projector, temperature: float = 0.1, **kwargs):
        super().__init__(encoder, augmenter, **kwargs)
        self.projector = projector
        self.temperature = temperature

    @property
    def online_parts(self):
        return [self.encoder, self.projector]

    def contrastive_loss(self, view1, view2):
        # Both views in one pass: NT-Xent compares all 2B projections anyway.
        z = self.projector(self.encoder(tf.concat([view1, view2], 0), training=True), training=True)
        z1, z2 = tf.split(z, 2)
        return nt_xent_across_replicas(z1, z2, self.temperature), z1


def build(parts: Parts, settings: dict) -> SimCLR:
    # Sec. "Experimental settings": 256 -> 256; the ResNet-50 appendix: 1024 -> 2048.
    big, width = parts.encoder_name == "resnet50", settings["projector_dim"]
    projector = build_projector(
        "simclr",
        parts.dim,
        width=width or (1024 if big else 256),
        output_dim=2048 if big and not width else width,
    )
    return SimCLR(parts.encoder, parts.augmenter, projector, settings["temperature"], name="simclr")
