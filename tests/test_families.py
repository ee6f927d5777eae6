"""The clustered-FL families beside IFCA: local, oracle, FeSEM (simulator, smoke data)."""
import numpy as np
import pytest

from cpcfl_tf.config import get_preset
from cpcfl_tf.errors import UserError
from cpcfl_tf.federated import algorithm
from cpcfl_tf.federated.clients import clients_for
from cpcfl_tf.federated.metrics import cluster_ari
from cpcfl_tf.federated.simulator import run_federated

SMOKE = get_preset("smoke")


@pytest.fixture(scope="module")
def clients():
    return clients_for(SMOKE)


def run(clients, method, checkpoint=None, on_round=None, **federated):
    config = SMOKE.with_overrides(federated={"method": method, "pretraining": "none",
                                             "rounds": 3, "head_rounds": 0, **federated})
    return run_federated(config, clients, verbose=0, checkpoint=checkpoint, on_round=on_round)


class Killed(Exception):
    pass


def kill_after(rounds):
    def on_round(record, state):
        if record["round"] == rounds:
            raise Killed
    return on_round


def one_round_by_hand(clients, fl, ids):
    """Round 1 from the initial pool: every client trains model ``ids[u]`` with the
    round's batches; returns the trained weights stacked over clients."""
    from cpcfl_tf.federated.backends import (LocalTraining, backend_of, batch_orders,
                                             stack_models)
    from cpcfl_tf.federated.simulator import build_template, initial_pool

    template = build_template(fl, clients.train.images.shape[2:], clients.num_classes)
    backend = backend_of(template, fl)
    pool = initial_pool(fl, template, None, seed=0, attempt=0)
    n = clients.train.num_clients
    plan = algorithm.plan_round(fl, 0, 0, 0, n, ids)
    return backend.train(stack_models(pool), ids, clients.train,
                         batch_orders(n, clients.train.size, fl.local_epochs, plan.batch_seed),
                         algorithm.encoder_epochs(fl, plan), LocalTraining.of(fl))


def test_local_trains_each_client_alone_and_sends_nothing(clients):
    record, _ = run(clients, "local")
    n = clients.train.num_clients
    assert record.config.federated.num_clusters == n
    assert all(r.cluster_ids == list(range(n)) for r in record.rounds)
    assert (record.final.bytes_down, record.final.bytes_up) == (0, 0)
    # after one round each client holds exactly what it trained alone from its own model
    _, state = run(clients, "local", rounds=1)
    trained = one_round_by_hand(clients, record.config.federated, np.arange(n))
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
    trained = one_round_by_hand(clients, record.config.federated, groups)
    for g in range(3):
        members = np.flatnonzero(groups == g)
        expected = algorithm.weighted_average([a[members] for a in trained],
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
    found = algorithm.nearest_centres(centres, clients)
    assert np.array_equal(found, truth) and cluster_ari(truth, found) == 1.0


def test_the_server_assigning_methods_are_simulator_only_for_now():
    from cpcfl_tf.flower.common import run_config

    for method in ("local", "oracle", "fesem"):
        with pytest.raises(UserError, match=f"method '{method}' is not available on Flower"):
            run_config({"method": method, "pretraining": "none"})
