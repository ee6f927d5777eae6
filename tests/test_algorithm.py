"""The algorithm's functions, against independent NumPy computations."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cpcfl_tf import aggregation
from cpcfl_tf.clustered import algorithm, restarts
from cpcfl_tf.plan.resolve import resolve
from helpers import plan_of

RNG = np.random.default_rng(0)


def random_state(num_models=3, shapes=((4, 3), (3,), (3, 2))):
    models = [[RNG.normal(size=s).astype(np.float32) for s in shapes] for _ in range(num_models)]
    return algorithm.ServerState(0, models, num_encoder=2)


def test_weighted_average_per_cluster_and_empty_cluster_keeps_its_weights():
    state = random_state()
    clients = 5
    stacked = [RNG.normal(size=(clients, *a.shape)).astype(np.float32) for a in state.models[0]]
    ids = np.array([0, 2, 0, 2, 2])  # nobody chose cluster 1
    sizes = np.array([50, 20, 30, 10, 40])
    new = algorithm.aggregate(state, stacked, ids, sizes)
    assert new.round == 1
    for n in (0, 2):
        members = ids == n
        for i, a in enumerate(stacked):
            expected = (sizes[members, None] * a[members].reshape(members.sum(), -1)).sum(0) / sizes[members].sum()
            np.testing.assert_allclose(new.models[n][i].ravel(), expected, rtol=1e-6)
    for old, kept in zip(state.models[1], new.models[1]):
        assert np.array_equal(old, kept)


def test_global_encoder_is_shared_and_heads_stay_per_cluster():
    state = random_state()
    stacked = [RNG.normal(size=(4, *a.shape)).astype(np.float32) for a in state.models[0]]
    ids, sizes = np.array([0, 1, 1, 2]), np.array([1.0, 2.0, 3.0, 4.0])
    new = algorithm.aggregate(state, stacked, ids, sizes, global_encoder=True)
    everyone = aggregation.weighted_average(stacked[:2], sizes)
    for model in new.models:
        for got, want in zip(model[:2], everyone):
            np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(new.models[1][2], (2 * stacked[2][1] + 3 * stacked[2][2]) / 5,
                               rtol=1e-6)


def test_selection_is_the_argmin_of_the_training_loss():
    losses = RNG.random((20, 4))
    ids = algorithm.select_clusters(losses, 4, False, np.random.default_rng(1))
    assert np.array_equal(ids, losses.argmin(axis=1))


def test_ties_are_broken_at_random_and_exploration_is_uniform():
    losses = np.array([[0.5, 0.1, 0.1, 0.9]] * 400)
    ids = algorithm.select_clusters(losses, 4, False, np.random.default_rng(2))
    assert set(np.unique(ids)) == {1, 2} and 150 < (ids == 1).sum() < 250
    random_ids = algorithm.select_clusters(None, 3, True, np.random.default_rng(3), 3000)
    assert np.all(np.abs(np.bincount(random_ids) / 3000 - 1 / 3) < 0.03)


@pytest.mark.parametrize("ids,failed", [
    ([0] * 9, True),                          # one model chosen by all
    ([0, 0, 0, 0, 1, 1, 1, 1, 2], True),      # a cluster below half its fair share of 3
    ([0, 0, 0, 1, 1, 1, 2, 2, 2], False),
    ([0, 0, 0, 0, 1, 1, 2, 2, 2], False),
    # exactly on the threshold: 2 of 12 is half the fair share 4, which is not below it
    ([0] * 5 + [1] * 5 + [2] * 2, False),
    ([0] * 6 + [1] * 5 + [2] * 1, True),
])
def test_clustering_failure(ids, failed):
    assert restarts.clustering_failed(np.array(ids), 3, 0.5) is failed


def test_clustering_failure_is_judged_on_the_clients_that_took_part():
    """With partial participation, clients not drawn yet hold -1 (this crashed
    np.bincount before)."""
    assert restarts.clustering_failed(np.array([-1, 0, 1, 2, -1, 0, 1, 2]), 3, 0.5) is False
    assert restarts.clustering_failed(np.array([-1, 0, 0, -1, 0]), 3, 0.5) is True
    assert restarts.clustering_failed(np.array([-1, -1]), 3, 0.5) is False


def test_ari_leaves_out_clients_that_never_took_part():
    from cpcfl_tf.clustered.metrics import cluster_ari

    groups = np.array([0, 0, 1, 1, 2, 2])
    assert cluster_ari(groups, np.array([2, 2, 0, -1, 1, -1])) == 1.0
    assert cluster_ari(groups, np.array([2, 2, 0, 0, 1, 1])) == 1.0
    assert cluster_ari(groups, np.array([0, -1, 0, -1, 0, -1])) == 0.0


def test_communication_cost_is_n_plus_one_s_per_client_and_round():
    state = random_state()
    size = algorithm.model_bytes(state.models[0])
    assert size == 4 * (12 + 3 + 6)
    down, up = algorithm.round_bytes(60, 3, size)
    assert down + up == 60 * (3 + 1) * size
    assert sum(algorithm.round_bytes(60, 1, size)) == 60 * 2 * size


@pytest.mark.parametrize("participation", [1.0, 0.5])
def test_a_node_alone_selects_what_the_simulator_selects_for_it(participation):
    run = plan_of(method="cp-cfl", pretraining="simclr", num_clusters=3, head_rounds=2,
                  participation=participation)
    losses = np.array([[0.5, 0.5, 0.9], [0.2, 0.1, 0.1], [0.3, 0.3, 0.3], [0.7, 0.2, 0.4],
                       [0.1, 0.1, 0.1], [0.4, 0.4, 0.0]])
    draws = []
    for t in range(20):
        plan = algorithm.plan_round(run, 0, 0, t, len(losses))
        assert plan.head_only == (t < 2) == (plan.drawn is not None)
        assert len(plan.participants) == int(6 * participation)
        again = algorithm.plan_round(run, 0, 0, t, len(losses))  # recomputable anywhere
        assert np.array_equal(plan.participants, again.participants)
        assert not plan.head_only or np.array_equal(plan.drawn, again.drawn)
        mine = losses[plan.participants]
        together = algorithm.select(plan, None if plan.head_only else mine)
        draws.append(tuple(together))
        for row in range(len(mine)):  # a Flower node sees only its own row of losses
            alone = np.zeros_like(mine)
            alone[row] = mine[row]
            picked = algorithm.select(plan, None if plan.head_only else alone)
            assert picked[row] == together[row]
    assert len(set(draws[2:])) > 1  # exact ties are broken by the round's draw


def test_streams_and_restart_rule():
    from cpcfl_tf.clustered.algorithm import Stream, stream_seed
    from cpcfl_tf.clustered.restarts import should_restart

    assert stream_seed(3, 1, 7, Stream.BATCHES) == [3, 1, 7, 1]
    failed, fine = np.zeros(9, np.int64), np.repeat([0, 1, 2], 3)
    ifca = plan_of(method="ifca", pretraining="none", restart_round=10,
                   max_restarts=2)  # IFCA has no Tc phase
    assert ifca.head_rounds == 0
    assert should_restart(ifca, 10, 0, failed) and not should_restart(ifca, 10, 0, fine)
    assert not should_restart(ifca, 9, 0, failed) and not should_restart(ifca, 10, 2, failed)
    cp_cfl = plan_of(method="cp-cfl", pretraining="simclr", restart_round=10, head_rounds=0)
    assert not should_restart(cp_cfl, 10, 0, failed)


def test_the_algorithm_takes_the_plan():
    """A requested config would run FedAvg with three models and give IFCA a Tc phase:
    the algorithm takes the run's plan, which holds the config as the method runs it."""
    from cpcfl_tf.plan.presets import get_preset

    requested = get_preset("smoke").with_overrides(federated={"method": "fedavg",
                                                              "pretraining": "none"})
    assert requested.federated.num_clusters == 3  # what would have run
    plan = resolve(requested)
    assert (plan.requested, plan.num_models, plan.head_rounds) == (requested, 1, 0)
    assert algorithm.plan_round(plan, 0, 0, 0, 9).num_models == 1
    assert algorithm.sent_models(plan) == 1  # FedAvg sends its one model
    resolved = plan.config
    assert resolve(resolved).config is resolved  # a record's config is resolved already
    # a resolved config changed is a requested one again
    assert type(resolved.with_overrides(federated={"rounds": 2}).federated).__name__ == (
        "FederatedConfig")


def test_the_restart_check_reads_the_round_it_is_applied_after():
    """CP-CFL+restart with Tc = 1 and restart_round = 2 checks the clusters after round
    3 (hand-worked: Tc + restart_round). A first attempt merged only in round 3, its last,
    restarts (so the runner makes it rather than take CP-CFL's run); one merged only in
    round 2, or one that never reaches round 3, does not."""
    from cpcfl_tf.clustered.restarts import restart_check_round, would_restart

    settings = dict(pretraining="simclr", rounds=3, head_rounds=1, restart_round=2,
                    num_clusters=3)
    run = plan_of(method="cp-cfl-restart", **settings)
    groups, merged = [0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 2, 2]
    assert restart_check_round(run.federated) == 3
    assert would_restart(run, [groups, groups, merged])
    assert not would_restart(run, [groups, merged, groups])
    assert not would_restart(run, [groups, merged])
    assert not would_restart(plan_of(method="cp-cfl", **settings), [groups, groups, merged])


def _by_hand_median(a):
    """The coordinate-wise median by sorting: the middle member, or the mean of the two."""
    s, n = np.sort(a.astype(np.float64), axis=0), len(a)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _cut(n, beta):
    """The rule by hand: int(beta * n) from each end, but one at least from three members on."""
    return 0 if n < 3 else max(1, int(beta * n))


def _by_hand_trimmed(a, beta):
    """Sort each coordinate, drop _cut(n, beta) members from each end, average the rest."""
    k, s = _cut(len(a), beta), np.sort(a.astype(np.float64), axis=0)
    return s[k:len(a) - k].mean(0)


@pytest.mark.parametrize("members", [1, 2, 3, 4, 5, 6, 7, 11])
@pytest.mark.parametrize("beta", [0.2, 0.25, 0.34])
def test_the_robust_combinations_are_the_coordinate_wise_median_and_trimmed_mean(members, beta):
    """Against the sorted values by hand, NumPy's median and SciPy's trim_mean (given the
    share that cuts the same count), at the cluster sizes a run meets; both ignore the
    example counts. From three members on the trimmed mean cuts one at least: the default
    0.2 of three or four members cuts one, where int(0.2 * n) would cut none."""
    from scipy.stats import trim_mean

    stacked = [RNG.normal(size=(members, *s)).astype(np.float32) for s in ((4, 3), (3,))]
    sizes = RNG.integers(1, 100, size=members)
    median = aggregation.combine(stacked, sizes, "median")
    trimmed = aggregation.combine(stacked, sizes, "trimmed-mean", beta)
    k = _cut(members, beta)
    assert aggregation.trim_count(members, beta) == k
    assert aggregation.tolerated("trimmed-mean", members, beta) == k
    assert aggregation.tolerated("median", members) == (members - 1) // 2
    for a, m, t in zip(stacked, median, trimmed):
        assert m.dtype == t.dtype == np.float32 and m.shape == t.shape == a.shape[1:]
        np.testing.assert_allclose(m, _by_hand_median(a), rtol=1e-6)
        np.testing.assert_allclose(m, np.median(a, axis=0), rtol=1e-6)
        np.testing.assert_allclose(t, _by_hand_trimmed(a, beta), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(t, trim_mean(a, (k + 0.5) / members, axis=0), rtol=1e-6,
                                   atol=1e-6)
        assert np.array_equal(m, aggregation.combine([a], np.ones(members), "median")[0])


def test_one_huge_member_moves_the_mean_but_not_the_median_or_trimmed_mean():
    """The attack of issue 78 by hand: three members, one sends every weight as 1e30. The
    mean becomes a third of it; the median is the larger honest value; the trimmed mean
    drops it, at the default beta 0.2 as at 0.34 (one of three is cut)."""
    honest = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
    stacked = [np.stack([honest, honest + 1, np.full_like(honest, 1e30)])]
    mean = aggregation.combine(stacked, [1, 1, 1], "mean")[0]
    assert np.allclose(mean, 1e30 / 3, rtol=1e-6)
    np.testing.assert_array_equal(aggregation.combine(stacked, [1, 1, 1], "median")[0],
                                  honest + 1)
    for beta in (0.2, 0.34):
        np.testing.assert_array_equal(aggregation.combine(stacked, [1, 1, 1], "trimmed-mean",
                                                          beta)[0], honest + 1)
    # beta 0 is the mean, asked for
    assert np.allclose(aggregation.combine(stacked, [1, 1, 1], "trimmed-mean", 0.0)[0],
                       1e30 / 3, rtol=1e-6)


def test_an_update_longer_than_the_bound_is_scaled_to_it():
    """Hand-worked: from a model of zeros and ones, client 0's update has norm 10 over
    both arrays (6 and 8) and is halved to norm 5; client 1's (norm 2) is kept as sent,
    bits and all; the update is measured from the model of each reply's cluster id."""
    pool = [[np.zeros(2, np.float32), np.zeros(1, np.float32)],
            [np.ones(2, np.float32), np.ones(1, np.float32)]]
    weights = [np.array([[6.0, 0.0], [1.0, 1.0]], np.float32),
               np.array([[8.0], [1.0 + 2.0]], np.float32)]
    replies = algorithm.Replies(np.array([0, 1]), np.array([0, 1]), np.array([5.0, 5.0]),
                                weights)
    bounded = algorithm.bounded(replies, pool, 5.0)
    np.testing.assert_allclose(bounded.weights[0][0], [3.0, 0.0])
    np.testing.assert_allclose(bounded.weights[1][0], [4.0])
    assert np.array_equal(bounded.weights[0][1], weights[0][1])
    assert np.array_equal(bounded.weights[1][1], weights[1][1])
    assert bounded.weights[0].dtype == np.float32
    delta = np.concatenate([bounded.weights[0][0] - pool[0][0], bounded.weights[1][0] - pool[0][1]])
    assert np.linalg.norm(delta) == pytest.approx(5.0)
    assert algorithm.bounded(replies, pool, 100.0).weights[0] is weights[0]  # none longer
    # A reply within the bound keeps its arrays as sent beside one scaled down.
    far = algorithm.Replies(np.array([0, 1]), np.array([0, 0]), np.ones(2), [
        np.array([[1e30, 0.0], [0.1, 0.3]], np.float32), np.array([[0.0], [0.2]], np.float32)])
    kept = algorithm.bounded(far, pool, 1.0)
    assert np.array_equal(kept.weights[0][1], far.weights[0][1])
    assert np.linalg.norm(kept.weights[0][0]) == pytest.approx(1.0)


def test_a_run_aggregates_as_its_config_says():
    """run_rounds applies federated.update_norm to the replies and federated.aggregation
    within each cluster: a federation whose three clients all pick model 0, one of them
    sending 1e30, ends with the median's (or the bound's) model, not the mean's."""
    from cpcfl_tf.plan.presets import get_preset

    base = get_preset("smoke").with_overrides(federated={
        "method": "fedavg", "pretraining": "none", "rounds": 1, "head_rounds": 0})
    start = [np.zeros(3, np.float32)]

    class Three:
        num_clients = 3

        def train(self, models, plan):
            sent = np.stack([models[0][0] + 1, models[0][0] + 2, np.full(3, 1e30, np.float32)])
            return algorithm.Replies(np.arange(3), np.zeros(3, np.int64), np.ones(3), [sent])

        def observe(self, models, assigned, replies, round_, *, planned=None):
            return {"cluster_ids": assigned.tolist()}

    def final(**federated):
        run = resolve(base.with_overrides(federated=federated))
        state, _ = algorithm.run_rounds(run, 0, Three(), lambda attempt: algorithm.ServerState(
            0, [list(start)], num_encoder=0))
        return state.models[0][0]

    assert np.allclose(final(), 1e30 / 3, rtol=1e-6)
    np.testing.assert_array_equal(final(aggregation="median"), np.full(3, 2.0))
    bound = final(update_norm=np.sqrt(3.0))  # each update at most norm sqrt(3): 1 per weight
    np.testing.assert_allclose(bound, (1 + 1 + 1) / 3 * np.ones(3), rtol=1e-6)


_DEFENCES = {"mean": {}, "median": {"aggregation": "median"},
             "trimmed-mean": {"aggregation": "trimmed-mean"},
             "update-norm": {"update_norm": 1.0},
             "median + update-norm": {"aggregation": "median", "update_norm": 1.0},
             "trimmed-mean + update-norm": {"aggregation": "trimmed-mean", "update_norm": 1.0}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=st.integers(1, 6), defence=st.sampled_from(sorted(_DEFENCES)),
       seed=st.integers(0, 2 ** 16))
def test_which_defences_bound_the_pool_at_each_cluster_size(members, defence, seed):
    """One cluster (FedAvg, N = 1) of 1-6 members, the last of them sending every weight
    as 1e30 in each of three rounds, the honest ones their model moved by at most 0.5 per
    weight. The pool stays bounded (|w| <= 3: three rounds of moves of at most 1) exactly
    where a norm bound (1.0) is set or a robust aggregation has 3 members or more; the mean
    alone is 1e30 / n away. A robust aggregation without the bound is refused in one line
    where the cluster has fewer than 3 members, and with the bound the round's record
    names the cluster as too few to defend."""
    from cpcfl_tf.errors import UserError
    from cpcfl_tf.plan.presets import get_preset

    settings_ = _DEFENCES[defence]
    robust = settings_.get("aggregation") in ("median", "trimmed-mean")
    config = get_preset("smoke").with_overrides(
        partition={"num_clients": members, "num_groups": 1},
        federated={"method": "fedavg", "pretraining": "none", "rounds": 3, "head_rounds": 0,
                   **settings_})
    if robust and "update_norm" not in settings_ and members < 3:
        with pytest.raises(UserError, match="set federated.update_norm too"):
            resolve(config, checked=True)
        return
    rng = np.random.default_rng(seed)

    class Cluster:
        num_clients = members

        def train(self, models, plan):
            sent = [models[0][0] + rng.uniform(-0.5, 0.5, 3).astype(np.float32)
                    for _ in range(members - 1)] + [np.full(3, 1e30, np.float32)]
            return algorithm.Replies(np.arange(members), np.zeros(members, np.int64),
                                     np.ones(members), [np.stack(sent)])

        def observe(self, models, assigned, replies, round_, *, planned=None):
            return {"cluster_ids": assigned.tolist()}

    state, progress = algorithm.run_rounds(
        resolve(config, checked=True), 0, Cluster(),
        lambda attempt: algorithm.ServerState(0, [[np.zeros(3, np.float32)]], num_encoder=0))
    largest = float(np.abs(state.models[0][0]).max())
    bounded = "update_norm" in settings_ or (robust and members >= 3)
    if bounded:
        assert largest <= 3.0 + 1e-5
    else:
        assert largest >= 1e30 / members * 0.99
    named = [r.get("too_few_to_defend") for r in progress.history]
    assert named == [[0] if robust and members < 3 else None] * 3


def test_one_nodes_cluster_id_can_decide_ifcas_restart_vote():
    """What docs/flower.md's threat model says one node can do to the restart vote, by
    hand (min_cluster_share 0.5, N = 2): its id is one count. Eight honest clients split
    6 / 2 with the node make 9, threshold 0.5 * 9 / 2 = 2.25: joining the larger cluster
    forces a restart (2 < 2.25), joining the smaller prevents it. Three honest clients all
    in cluster 0 (a collapsed run) with the node alone in cluster 1: threshold 1, so the
    vote passes and the collapse is kept."""
    honest = np.array([0] * 6 + [1] * 2)
    assert restarts.clustering_failed(np.append(honest, 0), 2, 0.5)
    assert not restarts.clustering_failed(np.append(honest, 1), 2, 0.5)
    collapsed = np.zeros(3, np.int64)
    assert restarts.clustering_failed(np.append(collapsed, 0), 2, 0.5)
    assert not restarts.clustering_failed(np.append(collapsed, 1), 2, 0.5)
