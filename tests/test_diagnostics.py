"""The selection diagnostic and CP-CFL+restart, on constructed federations whose clients'
losses are computed by hand: a model is a point, a client's loss on it the squared
distance to its group's target, and local training moves the model halfway there (a
twentieth of the way in the Tc phase, where only the head trains)."""
import numpy as np
import pytest

from cpcfl_tf.clustered import algorithm, diagnostics, restarts
from cpcfl_tf.plan.resolve import resolve
from helpers import plan_of

TARGETS = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
"""Each true group's target point."""
GROUPS = np.repeat([0, 1, 2], 4)


class Points:
    """A :class:`~cpcfl_tf.clustered.algorithm.Federation` of 12 clients in 3 groups."""

    num_clients = len(GROUPS)

    def __init__(self):
        self.plans = []

    def losses(self, models):
        points = np.stack([m[0] for m in models])  # (N, 2)
        return np.square(TARGETS[GROUPS][:, None, :] - points[None]).sum(-1)

    def train(self, models, plan):
        self.plans.append(plan)
        part = plan.participants
        losses = None if plan.drawn is not None else self.losses(models)[part]
        ids = algorithm.select(plan, losses)
        start = np.stack([models[c][0] for c in ids])
        step = 0.05 if plan.head_only else 0.5
        trained = start + step * (TARGETS[GROUPS[part]] - start)
        return algorithm.Replies(part, ids, np.ones(len(part)), [trained.astype(np.float32)],
                                 losses=losses)

    def observe(self, models, assigned, replies, round_, *, planned=None):
        return {"accuracy": 0.0, "cluster_ids": assigned.tolist()}


def pool(*points):
    return algorithm.ServerState(0, [[np.array(p, np.float32)] for p in points], 0)


def rounds(plan, start, diagnose=0):
    federation = Points()
    history = []
    state, progress = algorithm.run_rounds(
        plan, 0, federation, start, diagnose=diagnose,
        on_round=lambda record, state, progress: history.append(record))
    return federation, progress, history


def test_near_equal_models_make_two_groups_pick_one_and_the_diagnostic_shows_it():
    plan = plan_of(method="ifca", pretraining="none", rounds=6, num_clusters=3,
                   max_restarts=0)
    # Heads left nearly alike (as random picks for Tc rounds leave them): groups 0 and 1
    # are a hair closer to model 0 than to models 2 and 1, group 2 to model 1.
    _, progress, history = rounds(plan, lambda a: pool((0.01, 0.01), (-0.01, -0.01),
                                                       (0.0, -0.02)), diagnose=2)
    first = history[0]["selection"]
    losses = np.array(first["losses"])
    expected = np.square(TARGETS[GROUPS][:, None] - np.array(
        [[0.01, 0.01], [-0.01, -0.01], [0.0, -0.02]])[None]).sum(-1)
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    np.testing.assert_allclose(first["margins"], np.sort(expected, 1)[:, 1] - expected.min(1),
                               rtol=1e-5)
    assert first["clients"] == list(range(12))
    assert max(first["margins"][:8]) < 0.05  # groups 0 and 1: nearly a coin toss
    assert history[0]["cluster_ids"][:8] == [0] * 8
    assert "selection" in history[1] and "selection" not in history[2]  # K = 2 rounds
    merged = diagnostics.merges(GROUPS, [r["cluster_ids"] for r in history])
    assert merged == [{"groups": [0, 1], "model": 0, "final_from": 1}]


def test_distinct_models_keep_the_groups_apart_with_wide_margins():
    plan = plan_of(method="ifca", pretraining="none", rounds=4, num_clusters=3,
                   max_restarts=0)
    _, _, history = rounds(plan, lambda a: pool((0.9, 0.0), (0.0, 0.9), (-0.9, -0.9)),
                           diagnose=1)
    assert min(history[0]["selection"]["margins"]) > 1.0
    assert diagnostics.merges(GROUPS, [r["cluster_ids"] for r in history]) == []


def test_merges_date_the_round_from_which_two_groups_share_a_model_for_good():
    groups = np.array([0, 0, 1, 1, 2, 2])
    history = [[0, 1, 0, 1, 2, 2],    # groups 0 and 1 split evenly: no model of their own
               [0, 0, 1, 1, 2, 2],
               [0, 0, 0, 0, 2, 2],    # 0 and 1 share model 0 from here ...
               [0, 0, 0, 0, 2, 2]]
    assert diagnostics.merges(groups, history) == [{"groups": [0, 1], "model": 0,
                                                    "final_from": 3}]
    assert diagnostics.merges(groups, history[:2]) == []
    assert diagnostics.merges(groups, [[1, 1, 1, 1, 1, 1]]) == [
        {"groups": [0, 1, 2], "model": 1, "final_from": 1}]


def test_cp_cfl_restart_starts_over_with_the_tc_phase_and_counts_the_failed_attempt():
    plan = plan_of(method="cp-cfl-restart", pretraining="simclr", rounds=7, head_rounds=2,
                   num_clusters=3, restart_round=2, max_restarts=3)
    # Attempt 0: heads that merge groups 0 and 1 (and leave model 2 empty); attempt 1:
    # heads apart. The Tc phase's random picks are replaced by the pool's nearest choice
    # only from round 3 on, so what attempt 0 ends with is decided by its heads.
    starts = {0: pool((0.5, 0.5), (-1.0, -1.0), (5.0, 5.0)),
              1: pool((0.9, 0.0), (0.0, 0.9), (-0.9, -0.9))}

    def start(attempt):
        state = starts[attempt]
        return algorithm.ServerState(0, [list(m) for m in state.models], 0)

    federation, progress, history = rounds(plan, start)
    check = restarts.restart_check_round(plan.federated)
    assert check == 4  # Tc + restart_round
    assert progress.attempt == 1
    # the curve is the kept attempt's: rounds 1..7 once
    assert [r["round"] for r in progress.history] == list(range(1, 8))
    # the failed attempt's 4 rounds were sent too: 11 rounds of 12 clients, N + 1 models each
    size = algorithm.model_bytes(starts[0].models[0])
    assert progress.bytes_down == 11 * 12 * 3 * size and progress.bytes_up == 11 * 12 * size
    attempts = [(p.attempt, p.round, p.head_only) for p in federation.plans]
    assert attempts[:4] == [(0, 0, True), (0, 1, True), (0, 2, False), (0, 3, False)]
    assert attempts[4:6] == [(1, 0, True), (1, 1, True)]  # Tc again on the restart
    assert diagnostics.merges(GROUPS, [r["cluster_ids"] for r in progress.history]) == []


@pytest.mark.parametrize("method,pretraining,check", [("ifca", "none", 10),
                                                      ("cp-cfl-restart", "simclr", 20)])
def test_the_failure_test_comes_restart_round_rounds_after_the_clients_choose(
        method, pretraining, check):
    from cpcfl_tf.plan.presets import get_preset

    run = resolve(get_preset("quick").with_overrides(federated={
        "method": method, "pretraining": pretraining}))
    fl = run.federated
    assert restarts.restart_check_round(fl) == check
    failed = np.zeros(9, np.int64)
    assert restarts.should_restart(run, check, 0, failed)
    assert not any(restarts.should_restart(run, r, 0, failed) for r in range(1, 41)
                   if r != check)
