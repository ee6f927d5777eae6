"""IFCA's restart rule as the kit reads IFCA's random restarts ("IFCA restarts" in
docs/choices.md): when a run's clustering has failed (one model taken by every client, or
a cluster far below its fair share) at its check round, the run starts over with new
random models, a bounded number of times. IFCA and CP-CFL+restart have it
(:mod:`cpcfl_tf.methods.federated`); the round
(:func:`cpcfl_tf.clustered.algorithm.run_rounds`) asks :func:`should_restart` after each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cpcfl_tf.plan.resolve import RunPlan


def restart_check_round(fl) -> int:
    """The round after which IFCA's failure test is applied: ``fl.restart_round`` rounds
    after the clients began to choose by loss, i.e. after the Tc phase (IFCA has none, so
    it is ``restart_round`` itself; CP-CFL+restart's clusters are its clients' choices
    only from round Tc + 1 on: docs/choices.md)."""
    return fl.head_rounds + fl.restart_round


def should_restart(
    run: RunPlan, finished_round: int, attempt: int, cluster_ids: np.ndarray
) -> bool:
    """IFCA's restart rule: after :func:`restart_check_round`, a run of a method with
    restarts (:mod:`cpcfl_tf.methods.federated`) whose clustering failed starts over with new random
    models (new heads on the same pre-trained encoder), at most ``fl.max_restarts`` times.
    CP-CFL and FedAvg never restart (the paper gives CP-CFL no restart rule)."""
    fl = run.federated
    return (
        run.method.restarts
        and finished_round == restart_check_round(fl)
        and attempt < fl.max_restarts
        and clustering_failed(cluster_ids, fl.num_clusters, fl.min_cluster_share)
    )


def would_restart(run: RunPlan, cluster_ids_by_round: Sequence) -> bool:
    """Whether a run of ``run`` whose first attempt went as ``cluster_ids_by_round`` (each
    finished round's cluster ids) restarts: :func:`should_restart` at
    :func:`restart_check_round`, if the run gets that far."""
    check = restart_check_round(run.federated)
    return check <= len(cluster_ids_by_round) and should_restart(
        run, check, 0, np.asarray(cluster_ids_by_round[check - 1])
    )


def cluster_sizes(cluster_ids: Sequence[int] | np.ndarray, num_models: int) -> np.ndarray:
    """``(N,)`` clients per cluster, over the clients that have taken part (id >= 0: with
    partial participation some may not have been drawn yet)."""
    ids = np.asarray(cluster_ids)
    return np.bincount(ids[ids >= 0], minlength=num_models)


def clustering_failed(cluster_ids: np.ndarray, num_models: int, min_share: float) -> bool:
    """IFCA's failure: one model taken by every client, or a cluster whose share of
    clients is below ``min_share`` of the fair share ``1/N`` (docs/choices.md), judged on
    the clients that have taken part."""
    counts = cluster_sizes(cluster_ids, num_models)
    taken = int(counts.sum())
    if num_models == 1 or taken == 0:
        return False
    return bool(counts.max() == taken or counts.min() < min_share * taken / num_models)
