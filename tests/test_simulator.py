"""The simulator on real (smoke) data: algorithm, determinism, resume, errors."""
import os
import signal
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from cpcfl_tf.config import PretrainConfig, get_preset
from cpcfl_tf.contrastive.pretrain import pretrain
from cpcfl_tf.data import load_client_splits, load_unlabeled, partition_for
from cpcfl_tf.errors import UserError
from cpcfl_tf.federated.backends import (ClientArrays, KerasBackend, StackedBackend, batch_orders,
                                         client_losses, stack_models)
from cpcfl_tf.federated.simulator import make_clients, run_federated
from cpcfl_tf.models import build_classifier, build_classifier_head, build_encoder

SMOKE = get_preset("smoke")


@pytest.fixture(scope="module")
def clients():
    train, test = load_client_splits(SMOKE.data)
    return make_clients(partition_for(SMOKE, train, test), train, test)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    images = load_unlabeled("digits", "train[:697]", image_size=32)
    result = pretrain(PretrainConfig(epochs=1, batch_size=128), images,
                      tmp_path_factory.mktemp("enc"), verbose=0)
    return result.encoder.get_weights()


def config(**federated):
    return SMOKE.with_overrides(federated=federated)


def test_stacked_backend_trains_like_one_keras_model_per_client(clients):
    keras.utils.set_random_seed(0)
    model = build_classifier(build_encoder("cnn", (32, 32, 3)), build_classifier_head("c-1", 256, 10))
    data = ClientArrays(clients.train.images[:4], clients.train.labels[:4])  # 20 images each
    rng = np.random.default_rng(0)
    pool = [model.get_weights(),
            [w + 0.05 * rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()]]
    pool_stacked, ids = stack_models(pool), np.array([0, 1, 1, 0])
    orders = batch_orders(4, 20, 2, [0])  # two epochs of one batch: two steps
    kwargs = dict(batch_size=20, learning_rate=1e-3)
    stacked, keras_ = StackedBackend(model), KerasBackend(model)
    for encoder_epochs in ([True, True], [False, True]):
        a = stacked.train(pool_stacked, ids, data, orders, encoder_epochs, **kwargs)
        b = keras_.train(pool_stacked, ids, data, orders, encoder_epochs, **kwargs)
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, atol=2e-5)
    np.testing.assert_allclose(client_losses(stacked, pool, data), client_losses(keras_, pool, data),
                               rtol=1e-5)


def test_cp_cfl_keeps_the_encoder_frozen_during_tc_then_trains_it(clients, encoder):
    seen = []
    run_federated(config(rounds=4, head_rounds=2), clients, encoder_weights=encoder, verbose=0,
                  on_round=lambda record, state: seen.append([m[:len(encoder)] for m in state.models]))
    for round_, models in enumerate(seen, start=1):
        same = all(np.array_equal(a, b) for m in models for a, b in zip(m, encoder))
        assert same == (round_ <= 2), round_


def test_cp_cfl_and_ifca_recover_the_true_groups(clients, encoder):
    cp, _ = run_federated(config(rounds=4, head_rounds=1), clients, encoder_weights=encoder,
                          verbose=0)
    ifca, _ = run_federated(config(method="ifca", pretraining="none", rounds=4), clients,
                            verbose=0)
    assert cp["final"]["ari"] == 1.0 and ifca["final"]["ari"] == 1.0
    fedavg, state = run_federated(config(method="fedavg", pretraining="none", rounds=2),
                                  clients, verbose=0)
    assert len(state.models) == 1 and fedavg["final"]["ari"] == 0.0


def test_a_run_records_the_contract(clients, encoder):
    record, _ = run_federated(config(rounds=4, head_rounds=1, report_every=2), clients,
                              encoder_weights=encoder, verbose=0)
    assert [r["round"] for r in record["rounds"]] == [1, 2, 3, 4]
    assert all(0 <= r["accuracy"] <= 1 and len(r["cluster_ids"]) == 9 for r in record["rounds"])
    assert "f1_macro" in record["rounds"][1] and "f1_macro" not in record["rounds"][0]
    final = record["final"]
    for key in ("accuracy", "f1_macro", "f1_weighted", "auroc_ovr_macro", "auroc_ovr_weighted",
                "auroc_ovo_macro", "auroc_ovo_weighted", "ari", "restarts", "bytes_down",
                "bytes_up"):
        assert key in final, key
    assert final["bytes_down"] + final["bytes_up"] == (3 + 1) * final["model_bytes"] * 4 * 9
    assert record["config"]["federated"]["head_rounds"] == 1
    assert record["clients"][0]["group"] == 0


def test_the_same_seeds_give_the_same_run(clients, encoder):
    runs = [run_federated(config(rounds=3, head_rounds=1), clients, encoder_weights=encoder,
                          verbose=0)[0]["rounds"] for _ in range(2)]
    assert runs[0] == runs[1]
    other = run_federated(config(rounds=3, head_rounds=1), clients, encoder_weights=encoder,
                          verbose=0, train_seed=1)[0]["rounds"]
    assert other != runs[0]


def test_partial_participation_and_global_encoder(clients, encoder):
    record, state = run_federated(
        config(rounds=3, head_rounds=1, participation=1 / 3, global_encoder=True), clients,
        encoder_weights=encoder, verbose=0)
    final = record["final"]
    assert final["bytes_up"] == 3 * 3 * final["model_bytes"]  # 3 of 9 clients, 3 rounds
    assert len(encoder) == 10  # 4 convolutions and a dense layer, kernel and bias each
    models = state.models
    for model in models[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(model[:10], models[0][:10]))
        assert not np.array_equal(model[10], models[0][10])  # heads stay per cluster


def test_divergence_is_a_clear_error(clients):
    with pytest.raises(UserError, match=r"diverged .*federated\.learning_rate"):
        run_federated(config(method="fedavg", pretraining="none", rounds=2, learning_rate=1e30),
                      clients, verbose=0)


RUNNER = textwrap.dedent("""
    import sys
    from cpcfl_tf.config import get_preset
    from cpcfl_tf.data import load_client_splits, partition_for
    from cpcfl_tf.federated.simulator import make_clients, run_federated
    c = get_preset("smoke").with_overrides(
        federated={"method": "ifca", "pretraining": "none", "rounds": 6})
    train, test = load_client_splits(c.data)
    run_federated(c, make_clients(partition_for(c, train, test), train, test),
                  checkpoint=sys.argv[1], verbose=1)
""")


def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_result(clients, tmp_path):
    checkpoint = tmp_path / "run.npz"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(checkpoint)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:
            if "round 3/6" in line:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert checkpoint.exists()
    c = config(method="ifca", pretraining="none", rounds=6)
    resumed, _ = run_federated(c, clients, checkpoint=checkpoint, verbose=0)
    whole, _ = run_federated(c, clients, verbose=0)
    assert resumed["rounds"] == whole["rounds"]
    drop = lambda final: {k: v for k, v in final.items()}  # noqa: E731
    assert drop(resumed["final"]) == drop(whole["final"])


def test_a_checkpoint_of_another_run_is_refused(clients, tmp_path):
    checkpoint = tmp_path / "run.npz"
    run_federated(config(method="fedavg", pretraining="none", rounds=1, head_rounds=0), clients,
                  checkpoint=checkpoint, verbose=0)
    with pytest.raises(UserError, match="different run"):
        run_federated(config(method="fedavg", pretraining="none", rounds=2), clients,
                      checkpoint=checkpoint, verbose=0)
    checkpoint.write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot read checkpoint"):
        run_federated(config(method="fedavg", pretraining="none", rounds=1, head_rounds=0), clients,
                      checkpoint=checkpoint, verbose=0)


def test_ifca_fedavg_starts_from_the_fedavg_models_encoder(clients):
    from cpcfl_tf.federated.simulator import fedavg_encoder

    encoder, fedavg = fedavg_encoder(config(rounds=2, head_rounds=0), clients, verbose=0)
    assert len(encoder) == 10 and fedavg["config"]["federated"]["num_clusters"] == 1
    seen = []
    run_federated(config(method="ifca", pretraining="fedavg", rounds=2, head_rounds=0), clients,
                  encoder_weights=encoder, verbose=0,
                  on_round=lambda record, state: seen.append(state))
    assert len(seen[0].models) == 3
