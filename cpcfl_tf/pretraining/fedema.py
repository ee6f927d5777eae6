"""FedEMA ("Divergence-aware federated self-supervised learning", Zhuang et al., ICLR 2022,
Sec. 4): FedBYOL whose client does not overwrite its online network with the global one
but moves it toward it, the more the further it has diverged:

    w_k <- mu * w_k + (1 - mu) * w_global,   mu = min(lambda * ||w_global - w_k||, 1)

for the online encoder, projector and predictor (the paper's encoder and predictor; the
projector is part of EasyFL's ``online_encoder``), over their trainable weights (the
moving statistics of BatchNormalization come from the global model, as EasyFL's buffers
do). The divergence is the L2 norm over the online encoder's trainable weights of the
global model minus the client's after its last round (the paper's equation; EasyFL's code
uses the mean per-layer divergence of the client's previous local update instead:
docs/choices.md). lambda: the auto-scaler, ``tau`` / the client's divergence at its first
moving average (so that mu starts at tau = 0.7, Sec. 5), or ``scaler`` when set.
A client's first round starts from the global model, as in FedBYOL.
"""

from __future__ import annotations

import numpy as np

from cpcfl_tf.pretraining.fedavg_ssl import (
    ClientState,
    FedAvgSSL,
    Weights,
    set_parts,
    trainable_mask,
)


def divergence(global_weights: Weights, previous: Weights, mask: list[bool]) -> float:
    """``||w_global - w_client||`` over the arrays ``mask`` marks (float64)."""
    return float(
        np.sqrt(
            sum(
                np.sum((g.astype(np.float64) - p.astype(np.float64)) ** 2)
                for g, p, m in zip(global_weights, previous, mask)
                if m
            )
        )
    )


def moving_average(
    global_weights: Weights, previous: Weights, mu: float, mask: list[bool]
) -> Weights:
    """``mu * previous + (1 - mu) * global`` where ``mask`` marks a trainable array, the
    global array elsewhere."""
    return [
        (mu * p.astype(np.float64) + (1.0 - mu) * g.astype(np.float64)).astype(g.dtype) if m else g
        for g, p, m in zip(global_weights, previous, mask)
    ]


def ema_weight(distance: float, scaler: float) -> float:
    """mu = min(lambda * distance, 1)."""
    return min(scaler * distance, 1.0)


class FedEMA(FedAvgSSL):
    """FedBYOL with the divergence-aware moving average at the client's start. A client
    keeps its online parts after its round (``previous``) and its lambda (``scaler``);
    a round's record gains the clients' mean mu."""

    reported = ("mu",)

    def local_start(self, model, global_weights: Weights, state: ClientState) -> dict:
        record = super().local_start(model, global_weights, state)  # targets, as FedBYOL
        previous = state.weights.get("previous")
        if previous is None:
            return record
        shared = self.shared(model)
        encoder_mask = trainable_mask([model.encoder])
        distance = divergence(
            global_weights[: len(encoder_mask)], previous[: len(encoder_mask)], encoder_mask
        )
        if "scaler" not in state.numbers:
            state.numbers["scaler"] = self.settings["scaler"] or (
                self.settings["tau"] / distance if distance > 0 else 1.0
            )
        mu = ema_weight(distance, state.numbers["scaler"])
        set_parts(shared, moving_average(global_weights, previous, mu, trainable_mask(shared)))
        return {"mu": mu, "divergence": distance}

    def local_end(self, model, state: ClientState) -> Weights:
        sent = super().local_end(model, state)
        state.weights["previous"] = sent  # its own: sending copies it
        return sent


def build(settings: dict) -> FedEMA:
    return FedEMA(settings)
