"""The clustered-FL families beside IFCA: local, oracle, FeSEM, CFL, FL+HC, PACFL,
FedGroup (simulator, smoke data, and constructed cases with a known answer)."""
from pathlib import Path

import numpy as np
import pytest

from cpcfl_tf import aggregation
from cpcfl_tf.methods import clustering, rules
from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.errors import UserError
from cpcfl_tf.clustered import algorithm
from cpcfl_tf.clustered.clients import clients_for
from cpcfl_tf.clustered.metrics import cluster_ari
from cpcfl_tf.clustered.simulator import run_federated
from cpcfl_tf.plan.resolve import resolve
from helpers import Killed, kill_after
from cpcfl_tf.plan.context import RunContext

SMOKE = get_preset("smoke")


@pytest.fixture(scope="module")
def clients():
    return clients_for(SMOKE)


def run(clients, method, checkpoint=None, on_round=None, **federated):
    config = SMOKE.with_overrides(federated={"method": method, "pretraining": "none",
                                             "rounds": 3, "head_rounds": 0, **federated})
    return run_federated(resolve(config), clients, context=RunContext(verbose=0), checkpoint=checkpoint, on_round=on_round)


def one_round_by_hand(clients, plan, ids):
    """Round 1 of ``plan`` from the initial pool: every client trains model ``ids[u]``
    with the round's batches; returns the trained weights stacked over clients."""
    from cpcfl_tf.clustered.backends import backend_of
    from cpcfl_tf.clustered.local import LocalTraining, batch_orders, stack_models
    from cpcfl_tf.clustered.pool import build_template, initial_pool

    fl = plan.federated
    template = build_template(plan, clients.train.images.shape[2:], clients.num_classes)
    backend = backend_of(template, fl)
    pool = initial_pool(plan, template, None, seed=0, attempt=0)
    n = clients.train.num_clients
    round_ = algorithm.plan_round(plan, 0, 0, 0, n, ids)
    return backend.train(stack_models(pool), ids, clients.train,
                         batch_orders(n, clients.train.size, fl.local_epochs, round_.batch_seed),
                         algorithm.epoch_parts(fl, round_), LocalTraining.of(fl))


def test_local_trains_each_client_alone_and_sends_nothing(clients):
    record, _ = run(clients, "local")
    n = clients.train.num_clients
    assert record.config.federated.num_clusters == n
    assert all(r.cluster_ids == list(range(n)) for r in record.rounds)
    assert (record.final.bytes_down, record.final.bytes_up) == (0, 0)
    # after one round each client holds exactly what it trained alone from its own model
    _, state = run(clients, "local", rounds=1)
    trained = one_round_by_hand(clients, resolve(record.config), np.arange(n))
    for u in range(n):
        for a, b in zip(state.models[u], trained):
            np.testing.assert_array_equal(a, b[u])


def test_oracle_is_fedavg_within_each_true_group(clients):
    record, _ = run(clients, "oracle")
    groups = np.unique(clients.groups, return_inverse=True)[1]
    assert record.config.federated.num_clusters == 3
    assert all(r.cluster_ids == groups.tolist() for r in record.rounds)
    assert record.final.ari == 1.0
    # each client is sent its group's model only: S down and S up per client per round
    n, size = clients.train.num_clients, record.final.model_bytes
    assert (record.final.bytes_down, record.final.bytes_up) == (3 * n * size, 3 * n * size)
    # one round: each group's model is the |D_u|-weighted average of what its members trained
    _, state = run(clients, "oracle", rounds=1)
    trained = one_round_by_hand(clients, resolve(record.config), groups)
    for g in range(3):
        members = np.flatnonzero(groups == g)
        expected = aggregation.weighted_average([a[members] for a in trained],
                                              clients.sizes[members])
        for a, b in zip(state.models[g], expected):
            np.testing.assert_array_equal(a, b)


def test_fesem_assigns_by_distance_and_resumes(clients, tmp_path):
    record, state = run(clients, "fesem")
    assert record.config.federated.num_clusters == 3 and len(state.models) == 3
    n, size = clients.train.num_clients, record.final.model_bytes
    assert (record.final.bytes_down, record.final.bytes_up) == (3 * n * size, 3 * n * size)
    # killed after round 2 and resumed: the same record (the assignment is checkpointed)
    path = tmp_path / "run.ckpt.npz"
    with pytest.raises(Killed):
        run(clients, "fesem", checkpoint=path, on_round=kill_after(2))
    again, _ = run(clients, "fesem", checkpoint=path)
    assert [r.cluster_ids for r in again.rounds] == [r.cluster_ids for r in record.rounds]
    assert [r.accuracy for r in again.rounds] == [r.accuracy for r in record.rounds]


def test_nearest_centres_recovers_three_groups():
    """FeSEM's E-step on a constructed case: clients around three distinct centres."""
    rng = np.random.default_rng(0)
    centres = [[rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=5).astype(np.float32)]
               for _ in range(3)]
    truth = np.repeat([2, 0, 1], 4)
    clients = [np.stack([centres[g][i] + 0.01 * rng.normal(size=centres[g][i].shape)
                         for g in truth]).astype(np.float32) for i in range(2)]
    found = clustering.nearest_centres(centres, clients)
    assert np.array_equal(found, truth) and cluster_ari(truth, found) == 1.0


def test_flower_runs_every_method_that_sends_something_and_refuses_local():
    from cpcfl_tf.flower.common import run_config
    from cpcfl_tf.methods.federated import METHODS

    for name in ("oracle", "fesem", "cfl", "fl-hc", "pacfl"):
        assert METHODS[name].on_flower
        assert run_config({"method": name, "pretraining": "none"}).federated.method == name
    with pytest.raises(UserError, match="method 'local' trains each client alone and sends "
                                        "nothing.*run it in the simulator"):
        run_config({"method": "local", "pretraining": "none"})
    with pytest.raises(UserError, match="method 'cp-cfl-features' is not available on Flower "
                                        "yet .*run it in the simulator"):
        run_config({"method": "cp-cfl-features", "pretraining": "simclr"})
    for name in ("fedper", "lg-fedavg", "fedrep", "ditto", "fedavg-ft"):  # personalized
        assert run_config({"method": name, "pretraining": "none"}).federated.method == name
    assert {m.asks_first for m in METHODS.values()} == {None, "group", "subspace", "features"}
    assert (METHODS["oracle"].asks_first, METHODS["pacfl"].asks_first) == ("group", "subspace")


def _replies(start, ids, updates):
    """Replies of clients in clusters ``ids`` that moved their cluster's model by ``updates``."""
    trained = np.stack([start.models[c][0] for c in ids]) + updates
    return algorithm.Replies(np.arange(len(ids)), np.asarray(ids), np.full(len(ids), 50.0),
                             [trained.astype(np.float32)])


def _stepping(**fl):
    """What the round's server step reads of a plan, for the settings ``fl`` (a stand-in
    naming the method and its options): its method's rule and those settings."""
    from types import SimpleNamespace

    from cpcfl_tf.methods.federated import METHODS

    return SimpleNamespace(federated=SimpleNamespace(**fl), rule=METHODS[fl["method"]].rule)


def _cfl(**options):
    return _stepping(method="cfl", options={"eps1": 0.4, "eps2": 1.6, "split_after": 20,
                                            "min_split_size": 3, "max_cross": 1.0, **options})


def test_cfl_splits_three_groups_apart_in_two_steps():
    """Constructed updates: three groups pull 120 degrees apart (the mean is ~0, each is
    large), so round 1 splits one group off; in round 2 the two left pull opposite ways."""
    fl, rng = _cfl(), np.random.default_rng(0)
    truth = np.repeat([0, 1, 2], 3)
    angle = 2 * np.pi * truth / 3
    d = np.stack([np.cos(angle), np.sin(angle), np.zeros(9)], 1) * 2.0
    state = algorithm.ServerState(25, [[np.zeros(3, np.float32)] for _ in range(3)], 0,
                                  np.zeros(9, np.int64))
    ids, state, _ = algorithm.server_ids(fl, state, _replies(state, np.zeros(9, np.int64),
                                                          d + 0.01 * rng.normal(size=d.shape)))
    assert len(set(ids.tolist())) == 2 and cluster_ari(truth, ids) < 1
    state.assignment = ids
    pair = [c for c in set(ids.tolist()) if (ids == c).sum() == 6][0]
    members = np.flatnonzero(ids == pair)
    e = np.zeros((9, 3))
    e[members, 2] = np.where(truth[members] == truth[members][0], 2.0, -2.0)
    e[ids != pair] = [2.0, 0, 0]  # the group alone: its updates agree, no split
    ids, state, _ = algorithm.server_ids(fl, state, _replies(state, ids, e))
    assert cluster_ari(truth, ids) == 1.0


def test_cfl_does_not_split_a_group_whose_updates_agree_nor_before_split_after():
    fl, rng = _cfl(), np.random.default_rng(1)
    same = np.array([1.0, 1.0, 0.0]) + 0.2 * rng.normal(size=(9, 3))  # mean norm > eps1
    state = algorithm.ServerState(25, [[np.zeros(3, np.float32)] for _ in range(3)], 0,
                                  np.zeros(9, np.int64))
    ids, _, _ = algorithm.server_ids(fl, state, _replies(state, np.zeros(9, np.int64), same))
    assert (ids == 0).all()
    apart = np.repeat([[2.0, 0, 0], [-2.0, 0, 0]], [5, 4], axis=0)  # would split at 25
    early = algorithm.ServerState(19, state.models, 0, np.zeros(9, np.int64))
    assert (algorithm.server_ids(fl, early, _replies(early, np.zeros(9, np.int64), apart))[0]
            == 0).all()
    assert len(set(algorithm.server_ids(fl, state, _replies(state, np.zeros(9, np.int64),
                                                            apart))[0].tolist())) == 2


def test_cfl_splits_only_when_the_two_parts_pull_apart_enough():
    """max_cross guards a split: parts at 60 degrees (cross similarity 0.5) split under
    max_cross 0.6, not under 0.4; the record shows the similarity compared."""
    state = algorithm.ServerState(25, [[np.zeros(3, np.float32)] for _ in range(3)], 0,
                                  np.zeros(8, np.int64))
    angle = np.repeat([0.0, np.pi / 3], 4) + 0.01 * np.random.default_rng(5).normal(size=8)
    apart = np.stack([np.cos(angle), np.sin(angle), np.zeros(8)], 1) * 2.0
    replies = _replies(state, np.zeros(8, np.int64), apart)
    ids, _, notes = algorithm.server_ids(_cfl(eps1=10.0, max_cross=0.6), state, replies)
    assert cluster_ari(np.repeat([0, 1], 4), ids) == 1.0
    test = notes["split_test"]["0"]
    unit = apart / np.linalg.norm(apart, axis=1, keepdims=True)
    assert test["cross_similarity"] == pytest.approx((unit[:4] @ unit[4:].T).max(), abs=1e-6)
    assert test["cross_similarity"] < 0.6
    held, _, _ = algorithm.server_ids(_cfl(eps1=10.0, max_cross=test["cross_similarity"] - 0.01),
                                      state, replies)
    assert (held == 0).all()


def test_cfl_runs_and_records_its_options(clients):
    record, state = run(clients, "cfl", options={"split_after": 1, "eps1": 1e9, "eps2": 0.0,
                                                 "max_cross": 1.0})
    from cpcfl_tf.methods.federated import METHODS

    assert record.config.federated.options == {**METHODS["cfl"].options, "eps1": 1e9,
                                               "eps2": 0.0, "split_after": 1, "max_cross": 1.0}
    assert record.requested.federated.options == {"split_after": 1, "eps1": 1e9, "eps2": 0.0,
                                                  "max_cross": 1.0}
    # split as soon as allowed, until the pool's 3 slots are used
    assert set(record.rounds[0].cluster_ids) == {0}
    assert len(set(record.rounds[-1].cluster_ids)) == 3
    # every round records the split test of every cluster its clients trained
    tests = [r.split_test for r in record.rounds]
    trained = [{0}] + [set(r.cluster_ids) for r in record.rounds[:-1]]
    assert [set(map(int, t)) for t in tests] == trained
    assert all(0 < t["mean_norm"] <= t["max_norm"] for ts in tests for t in ts.values())
    assert all(-1 <= t["cross_similarity"] <= 1 for ts in tests for t in ts.values()
               if t["cross_similarity"] is not None)
    assert record.rounds[1].to_json()["split_test"] == tests[1]
    with pytest.raises(UserError, match="cfl has no option.* eps3 .*its options: eps1, eps2"):
        run(clients, "cfl", options={"eps3": 1})
    with pytest.raises(UserError, match="ifca has no option.*its options: none"):
        run(clients, "ifca", options={"eps1": 1})


def test_fl_hc_clusters_once_at_its_round_and_resumes(clients, tmp_path):
    record, state = run(clients, "fl-hc", options={"cluster_round": 1})
    ids = [r.cluster_ids for r in record.rounds]
    assert set(ids[0]) == {0}  # FedAvg before the clustering round
    assert ids[1] == ids[2] and len(set(ids[1])) == 3  # clustered once, then kept
    assert record.config.federated.options == {"cluster_round": 1}
    n, size = clients.train.num_clients, record.final.model_bytes
    # one model down and up per client per round; the clustering reuses that round's uploads
    assert (record.final.bytes_down, record.final.bytes_up) == (3 * n * size, 3 * n * size)
    assert "bytes_other" not in record.final.to_json()
    path = tmp_path / "run.ckpt.npz"
    with pytest.raises(Killed):
        run(clients, "fl-hc", checkpoint=path, on_round=kill_after(2),
            options={"cluster_round": 1})
    again, _ = run(clients, "fl-hc", checkpoint=path, options={"cluster_round": 1})
    assert [r.cluster_ids for r in again.rounds] == ids
    assert [r.accuracy for r in again.rounds] == [r.accuracy for r in record.rounds]


def test_fl_hc_round_models_start_from_the_global_model():
    """At the clustering round every cluster's model is the average of its members'
    updates of the one global model (no cluster starts elsewhere)."""
    fl = _stepping(method="fl-hc", num_clusters=3, options={"cluster_round": 4})
    truth = np.repeat([0, 1, 2], 3)
    moves = np.array([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0]])[truth]
    moves += 0.05 * np.random.default_rng(0).normal(size=moves.shape)
    state = algorithm.ServerState(4, [[np.ones(3, np.float32)] for _ in range(3)], 0,
                                  np.zeros(9, np.int64))
    state.models[1] = [np.full(3, 7.0, np.float32)]  # stale slots must not leak in
    ids, state, _ = algorithm.server_ids(fl, state, _replies(state, np.zeros(9, np.int64), moves))
    assert cluster_ari(truth, ids) == 1.0
    assert all(np.array_equal(m[0], np.ones(3, np.float32)) for m in state.models)
    early = algorithm.ServerState(3, state.models, 0, np.zeros(9, np.int64))
    assert (algorithm.server_ids(fl, early, _replies(early, np.zeros(9, np.int64), moves))[0]
            == 0).all()


def test_hierarchical_clusters_recover_three_groups():
    rng = np.random.default_rng(2)
    truth = np.repeat([1, 2, 0], 5)
    centres = rng.normal(size=(3, 40)) * 3
    found = clustering.hierarchical_clusters(centres[truth] + rng.normal(size=(15, 40)), 3)
    assert cluster_ari(truth, found) == 1.0


def test_principal_angles_of_known_subspaces():
    e = np.eye(4)
    np.testing.assert_allclose(clustering.principal_angles(e[:, :2], e[:, :2]), [0, 0], atol=1e-7)
    np.testing.assert_allclose(clustering.principal_angles(e[:, :2], e[:, 2:]),
                               [np.pi / 2, np.pi / 2])
    tilted = np.stack([e[0], (e[1] + e[2]) / np.sqrt(2)], 1)
    np.testing.assert_allclose(clustering.principal_angles(e[:, :2], tilted), [0, np.pi / 4],
                               atol=1e-7)


def test_subspace_clusters_recover_groups_with_different_data_subspaces():
    """Clients whose images are mixtures of their group's own few patterns: the leading
    singular vectors span the group's patterns, so the angles separate the groups."""
    rng = np.random.default_rng(3)
    patterns = rng.random(size=(3, 4, 8 * 8 * 3))
    truth = np.repeat([2, 0, 1], 4)
    subspaces = []
    for g in truth:
        mix = rng.random(size=(30, 4)) @ patterns[g]
        images = np.clip(mix / mix.max() * 255, 0, 255).astype(np.uint8).reshape(30, 8, 8, 3)
        u = clustering.data_subspace(images, 3)
        assert u.shape == (8 * 8 * 3, 3) and u.dtype == np.float32
        subspaces.append(u)
    assert cluster_ari(truth, clustering.subspace_clusters(subspaces, 3)) == 1.0


def test_pacfl_clusters_before_training_and_counts_its_subspaces(clients):
    record, _ = run(clients, "pacfl")
    ids = [r.cluster_ids for r in record.rounds]
    assert ids[0] == ids[-1] and len(set(ids[0])) == 3  # one clustering, before round 1
    n, size = clients.train.num_clients, record.final.model_bytes
    d = int(np.prod(clients.train.images.shape[2:]))
    basis = record.config.federated.options["basis"]
    other = n * d * basis * 4  # float32, once per client
    assert record.final.bytes_other == other
    assert (record.final.bytes_down, record.final.bytes_up) == (3 * n * size,
                                                                3 * n * size + other)
    assert record.final.to_json()["bytes_other"] == other


def test_farthest_first_picks_one_client_of_each_far_apart_group():
    rng = np.random.default_rng(4)
    truth = np.repeat([0, 1, 2], 4)
    centres = rng.normal(size=(3, 30)) * 5
    stacked = [(centres[truth] + 0.1 * rng.normal(size=(12, 30))).astype(np.float32)]
    chosen = clustering.farthest_first(stacked, 3)
    assert len(chosen) == 3
    picked = [int(np.argmin(np.square(stacked[0] - c[0]).sum(1))) for c in chosen]
    assert sorted(truth[picked]) == [0, 1, 2]
    assert cluster_ari(truth, clustering.nearest_centres(chosen, stacked)) == 1.0


@pytest.fixture(scope="module")
def disjoint():
    """Real images (Fashion-MNIST): 9 clients in three groups of disjoint classes, and the
    same clients' shape in one group."""
    def clients(groups):
        config = get_preset("quick").with_overrides(partition={
            "num_clients": 9, "num_groups": groups, "classes_per_group": 3, "class_overlap": 0,
            "class_counts": (20, 20, 10)})
        return config, clients_for(config)
    return {groups: clients(groups) for groups in (3, 1)}


def on_fixed_encoder(config, clients, method, **options):
    """Four rounds of heads on a fixed random encoder (the encoder trains in no epoch)."""
    config = config.with_overrides(federated={
        "method": method, "pretraining": "none", "rounds": 4, "head_rounds": 0,
        "encoder_epochs": 0, "options": options or None})
    return run_federated(resolve(config), clients, context=RunContext(verbose=0))[0]


# On these heads the one-group federation's updates agree (mean update norm close to the
# largest), the three groups' do not (about half): eps1 = eps2 = 0.2 lies between
# (measured: 0.14 / 0.26 for three groups, 0.24 / 0.25 for one).
CFL_HEADS = {"split_after": 1, "eps1": 0.2, "eps2": 0.2}


@pytest.mark.parametrize("method, options", [("cfl", CFL_HEADS), ("fl-hc", {"cluster_round": 1}),
                                             ("fesem", {}), ("pacfl", {}), ("fedgroup", {})])
def test_each_family_recovers_three_groups_of_disjoint_classes(disjoint, method, options):
    config, clients = disjoint[3]
    record = on_fixed_encoder(config, clients, method, **options)
    assert record.final.ari == 1.0, [r.cluster_ids for r in record.rounds]


def test_cfl_does_not_split_one_group(disjoint):
    config, clients = disjoint[1]
    record = on_fixed_encoder(config, clients, "cfl", **CFL_HEADS)
    assert all(set(r.cluster_ids) == {0} for r in record.rounds)
    tests = [r.split_test["0"] for r in record.rounds]
    assert all(t["mean_norm"] > CFL_HEADS["eps1"] for t in tests)  # why: the updates agree


def test_the_cfl_and_pacfl_defaults_are_what_the_committed_calibration_derived():
    """methods.py's thresholds are read off results/quick/calibrate_families/ by the
    script's own rule: recomputed here from its CSV and report."""
    import csv
    import re

    from cpcfl_tf.methods.federated import METHODS
    from helpers import script

    folder = Path(__file__).parents[1] / "results" / "quick" / "calibrate_families"
    with open(folder / "calibrate_families.csv") as fh:
        measured = {r["run"]: {k: float(r[k]) for k in ("mean_norm", "max_norm",
                                                          "cross_similarity")}
                    for r in csv.DictReader(fh)}
    derived = script("calibrate_families").cfl_thresholds(measured)
    assert {k: METHODS["cfl"].options[k] for k in derived} == derived
    chosen = re.search(r"\*\*p = (\d+)\*\*", (folder / "calibrate_families.md").read_text())
    assert METHODS["pacfl"].options["basis"] == int(chosen.group(1))


def _fedgroup():
    return _stepping(method="fedgroup", num_clusters=3, options=None)


def test_fedgroup_groups_by_decomposed_cosines_at_the_cold_start_and_keeps_them():
    """Constructed updates of three groups, each along its own direction plus noise, with
    norms that differ by client: the cold start finds the groups from the cosines with
    the updates' leading singular directions (computed here independently), and a later
    round keeps them whatever the clients' replies say."""
    rng = np.random.default_rng(3)
    truth = np.repeat([0, 1, 2], 4)
    axes = np.linalg.qr(rng.normal(size=(40, 3)))[0].T  # three orthonormal directions
    updates = (axes[truth] + 0.2 * rng.normal(size=(12, 40))) * rng.uniform(0.5, 3, (12, 1))
    state = algorithm.ServerState(0, [[np.zeros(40, np.float32)] for _ in range(3)], 0,
                                  np.zeros(12, np.int64))
    ids, state, notes = algorithm.server_ids(_fedgroup(), state,
                                             _replies(state, np.zeros(12, np.int64), updates))
    assert cluster_ari(truth, ids) == 1.0 and notes == {}
    # the decomposition, by hand: top-3 right singular vectors, cosines with each
    u = updates.astype(np.float32).astype(np.float64)
    _, _, vt = np.linalg.svd(u, full_matrices=False)
    cosines = (u / np.linalg.norm(u, axis=1, keepdims=True)) @ vt[:3].T
    np.testing.assert_allclose(np.abs(clustering.decomposed_cosines(u, state.memory["directions"])),
                               np.abs(cosines), atol=1e-9)
    assert state.memory["grouped"].all()
    state.assignment = ids
    kept, _, _ = algorithm.server_ids(_fedgroup(), state,
                                      _replies(state, ids, rng.normal(size=(12, 40))))
    assert np.array_equal(kept, ids)  # static groups: no client moves


def test_fedgroup_places_a_newcomer_in_the_group_its_update_is_nearest():
    rng = np.random.default_rng(4)
    truth = np.repeat([0, 1, 2], 4)
    axes = np.linalg.qr(rng.normal(size=(40, 3)))[0].T
    updates = axes[truth] + 0.1 * rng.normal(size=(12, 40))
    state = algorithm.ServerState(0, [[np.zeros(40, np.float32)] for _ in range(3)], 0,
                                  np.zeros(14, np.int64))  # clients 12, 13 come later
    ids, state, _ = algorithm.server_ids(_fedgroup(), state,
                                         _replies(state, np.zeros(12, np.int64), updates))
    state.assignment[:12] = ids
    late = algorithm.Replies(np.array([12, 13]), np.array([0, 0]), np.full(2, 50.0),
                             [(2.0 * axes[[2, 1]]).astype(np.float32)])
    placed, state, _ = algorithm.server_ids(_fedgroup(), state, late)
    assert placed.tolist() == [ids[truth == 2][0], ids[truth == 1][0]]
    assert state.memory["grouped"].all()


def test_the_features_rule_puts_clear_groups_apart_where_near_alike_heads_merge_them():
    # CP-CFL+features (rules.FeatureGroups): the first choice after the Tc phase comes
    # from the clients' mean embeddings, not from the heads' losses. Constructed: three
    # groups far apart in the features, and heads that are near-alike (every loss about
    # 2.30, a uniform guess over ten classes) with model 0 a hair better for groups 0
    # and 1: by loss those two groups merge; by the features they stay apart.
    rng = np.random.default_rng(0)
    truth = np.repeat([0, 1, 2], 3)
    centres = rng.normal(size=(3, 16))
    answers = [clustering.mean_embedding(centres[g] + 0.05 * rng.normal(size=(20, 16)))
               for g in truth]
    run = resolve(SMOKE.with_overrides(federated={"method": "cp-cfl-features", "pretraining": "simclr",
                                         "num_clusters": 3, "head_rounds": 2}
                              ))
    fl = run.federated
    losses = 2.30 + 0.001 * rng.random((9, 3))
    losses[truth < 2, 0] -= 0.01
    losses[truth == 2, 1] -= 0.01
    by_loss = algorithm.select_clusters(losses, 3, False, rng)
    assert by_loss[0] == by_loss[3] and cluster_ari(truth, by_loss) < 1.0
    rule = rules.RULES["features"]
    state = algorithm.ServerState(0, [], 0, None, rule.remember(fl, answers))
    first = rule.assignment(fl, fl.head_rounds, state)  # round Tc + 1 (0-based t = Tc)
    assert all(len(set(first[truth == g])) == 1 for g in range(3)) and len(set(first)) == 3
    # Before (the Tc phase: random picks) and after (choice by loss) the clients choose.
    assert rule.assignment(fl, fl.head_rounds - 1, state) is None
    assert rule.assignment(fl, fl.head_rounds + 1, state) is None
    # Each embedding is scaled to unit length, then averaged: (0.6, 0.8) and (0, 1).
    assert np.allclose(clustering.mean_embedding(np.array([[3.0, 4.0], [0.0, 2.0]])), [0.3, 0.9])


def test_cp_cfl_features_takes_its_first_choice_from_the_encoders_features(clients, tmp_path):
    # On the smoke clients with the smoke SimCLR encoder: the Tc phase is CP-CFL's (the
    # same random picks), round Tc + 1 puts the clients where k-means over their mean
    # embeddings, computed here with the encoder itself and scikit-learn, puts them, and
    # the vectors sent count in bytes_other (float32, one per client).
    from sklearn.cluster import KMeans

    from cpcfl_tf.data.images import to_float
    from cpcfl_tf.clustered.pool import build_template
    from cpcfl_tf.running.runner import Runner

    config = SMOKE.with_overrides(federated={"method": "cp-cfl-features", "pretraining": "simclr",
                                             "rounds": 3, "head_rounds": 1})
    encoder = Runner("features", config, tmp_path, context=RunContext(verbose=0)).encoders(resolve(config))
    record, _ = run_federated(resolve(config), clients, encoder_weights=encoder, context=RunContext(verbose=0))
    plain, _ = run_federated(resolve(config.with_overrides(federated={"method": "cp-cfl"})),
                             clients, encoder_weights=encoder, context=RunContext(verbose=0))
    assert record.rounds[0].cluster_ids == plain.rounds[0].cluster_ids
    run = resolve(config)
    fl = run.federated
    model = build_template(run, clients.train.images.shape[2:], clients.num_classes)
    net = model.get_layer("encoder")
    net.set_weights(encoder)
    means = []
    for images in clients.train.images:
        z = net(to_float(images), training=False).numpy().astype(np.float64)
        means.append((z / np.linalg.norm(z, axis=1, keepdims=True)).mean(0))
    groups = KMeans(n_clusters=fl.num_clusters, n_init=10, random_state=0).fit(
        np.stack(means)).labels_
    assert cluster_ari(groups, np.array(record.rounds[1].cluster_ids)) == 1.0
    n, dim = clients.train.num_clients, len(means[0])
    assert record.final.bytes_other == n * dim * 4
    assert record.final.bytes_up == plain.final.bytes_up + n * dim * 4
    assert record.final.bytes_down == plain.final.bytes_down


def test_a_pacfl_answer_must_be_an_orthonormal_basis():
    """An honest client's data subspace at 32 x 32 x 3 pixels is orthonormal to float32
    rounding (its Gram matrix within 1e-6 of the identity here, far inside the
    tolerance); a hand-made orthonormal basis (a rotation of two axes) passes; an all-zero
    "basis" (issue 86: it sits at the largest angle from every client and becomes a
    cluster of its own), a scaled one and one with two equal columns are refused."""
    from cpcfl_tf.methods.rules import ORTHONORMAL_TOLERANCE

    from cpcfl_tf.methods.federated import METHODS

    rule = METHODS["pacfl"].rule
    images = np.random.default_rng(0).integers(0, 256, size=(40, 32, 32, 3), dtype=np.uint8)
    honest = clustering.data_subspace(images, 5)
    gram = honest.astype(np.float64).T @ honest.astype(np.float64)
    assert np.abs(gram - np.eye(5)).max() < 1e-6 < ORTHONORMAL_TOLERANCE
    assert rule.answer_problem(None, honest, 1) is None
    c, s = np.cos(0.3), np.sin(0.3)
    rotated = np.zeros((6, 2), np.float32)
    rotated[:2] = [[c, -s], [s, c]]
    assert rule.answer_problem(None, rotated, 1) is None
    for bad, off in ((np.zeros((6, 2), np.float32), "1"), (2 * rotated, "3"),
                     (np.repeat(rotated[:, :1], 2, axis=1), "1")):
        said = rule.answer_problem(None, bad, 1)
        assert said == (f"the basis is not orthonormal (its Gram matrix is {off} away from "
                        "the identity, more than 0.0001)"), said


def test_a_crafted_orthonormal_basis_can_still_take_a_cluster_of_its_own():
    """What docs/flower.md says a node can still do to PACFL within the orthonormality
    check: three honest groups of four clients (the recovery test's data) and one node
    whose basis is orthonormal but orthogonal to every honest subspace (the largest
    angles there are). With N = 3 the crafted basis is a cluster of its own and two honest
    groups share one; it passes the server's check."""
    rng = np.random.default_rng(3)
    patterns = rng.random(size=(3, 4, 8 * 8 * 3))
    truth = np.repeat([2, 0, 1], 4)
    subspaces = []
    for g in truth:
        mix = rng.random(size=(30, 4)) @ patterns[g]
        images = np.clip(mix / mix.max() * 255, 0, 255).astype(np.uint8).reshape(30, 8, 8, 3)
        subspaces.append(clustering.data_subspace(images, 3))
    assert cluster_ari(truth, clustering.subspace_clusters(subspaces, 3)) == 1.0
    honest = np.concatenate(subspaces, axis=1).astype(np.float64)
    # An orthonormal basis of the complement of every honest span.
    complement = np.linalg.svd(honest, full_matrices=True)[0][:, np.linalg.matrix_rank(honest):]
    crafted = complement[:, :3].astype(np.float32)
    from cpcfl_tf.methods.federated import METHODS

    assert METHODS["pacfl"].rule.answer_problem(None, crafted, 1) is None
    found = clustering.subspace_clusters([*subspaces, crafted], 3)
    assert sum(found == found[-1]) == 1  # alone
    assert len(set(found[:-1])) == 2  # the honest groups in two clusters: two merged
