"""The simulator on real (smoke) data: algorithm, determinism, resume, errors."""
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from cpcfl_tf.plan.sections import PretrainConfig
from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.pretraining.pretrain import pretrain
from cpcfl_tf.data import load_unlabeled
from cpcfl_tf.errors import UserError
from cpcfl_tf.clustered.backends import KerasBackend, client_losses
from cpcfl_tf.clustered.stacked import StackedBackend
from cpcfl_tf.clustered.local import LocalTraining, batch_orders, stack_models
from cpcfl_tf.clustered.clients import ClientArrays
from cpcfl_tf.clustered.clients import clients_for
from cpcfl_tf.clustered.simulator import run_federated
from cpcfl_tf.models import build_classifier, build_classifier_head, build_encoder
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.methods.ssl import SSL_METHODS
from cpcfl_tf.plan.context import RunContext

SMOKE = get_preset("smoke")


@pytest.fixture(scope="module")
def clients():
    return clients_for(SMOKE)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    images = load_unlabeled("digits", "train[:697]", image_size=32)
    result = pretrain(PretrainConfig(epochs=1, batch_size=128), images,
                      tmp_path_factory.mktemp("enc"), verbose=0, method=SSL_METHODS["simclr"])
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
    local = LocalTraining(batch_size=20, learning_rate=1e-3)
    stacked, keras_ = StackedBackend(model), KerasBackend(model)
    for epochs in (["model", "model"], ["head", "model"]):
        a = stacked.train(pool_stacked, ids, data, orders, epochs, local)
        b = keras_.train(pool_stacked, ids, data, orders, epochs, local)
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, atol=2e-5)
    np.testing.assert_allclose(client_losses(stacked, pool, data),
                               client_losses(keras_, pool, data), rtol=1e-5)


def test_frozen_features_train_the_head_as_one_keras_model_per_client_does(clients):
    """federated.frozen_features: in an epoch that freezes the encoder the head trains on
    features computed once (batches of 8 of 20 images: 8, 8, 4), not in each step. The
    reference is the Keras backend, which runs the frozen encoder in every step: equal
    to float32 rounding; the encoder is bitwise the default path's."""
    keras.utils.set_random_seed(2)
    model = build_classifier(build_encoder("cnn", (32, 32, 3)), build_classifier_head("c-1", 256, 10))
    data = ClientArrays(clients.train.images[:3], clients.train.labels[:3])
    pool, ids = stack_models([model.get_weights()]), np.zeros(3, np.int64)
    orders = batch_orders(3, 20, 3, [5])
    fast = LocalTraining(batch_size=8, frozen_features=True)
    stacked = StackedBackend(model)
    for epochs in (["head"] * 3, ["model", "head", "head"]):
        a = stacked.train(pool, ids, data, orders, epochs, fast)
        b = KerasBackend(model).train(pool, ids, data, orders, epochs, LocalTraining(batch_size=8))
        default = stacked.train(pool, ids, data, orders, epochs, LocalTraining(batch_size=8))
        k = stacked.num_encoder
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, atol=2e-5)
        assert all(np.array_equal(x, y) for x, y in zip(a[:k], default[:k]))
        assert not np.array_equal(a[-2], pool[-2])  # the head moved
    assert stacked._head_grads.experimental_get_tracing_count() >= 2  # batches of 8 and 4
    with pytest.raises(UserError, match="frozen_features needs the stacked backend"):
        KerasBackend(model).train(pool, ids, data, orders, ["head"] * 3, fast)
    # the run's setting reaches the clients' local training (and is off by default)
    assert LocalTraining.of(config(frozen_features=True).federated).frozen_features is True
    assert LocalTraining.of(config().federated).frozen_features is False


def test_pool_models_with_one_encoder_share_its_pass_and_keep_every_bit(clients):
    """Selection's losses: models 0, 1 and 3 have equal encoders (3's a copy), 2 its own;
    the shared encoder runs once, and every model's logits are the bits of a whole-model
    pass, its losses those of the cross-entropy worked out here."""
    from cpcfl_tf.clustered.backends import shared_encoders

    keras.utils.set_random_seed(3)
    model = build_classifier(build_encoder("cnn", (32, 32, 3)), build_classifier_head("c-1", 256, 10))
    w, k = model.get_weights(), len(model.get_layer("encoder").weights)
    rng = np.random.default_rng(3)

    def moved(arrays):
        return [a + 0.05 * rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
    head, encoder = moved(w[k:]), moved(w[:k])
    pool = [w, w[:k] + head, encoder + w[k:], [a.copy() for a in w[:k]] + moved(w[k:])]
    assert shared_encoders(pool, k) == [[0, 1, 3], [2]]
    backend, data = StackedBackend(model), ClientArrays(clients.train.images[:3], clients.train.labels[:3])
    passes = []
    backend.features = lambda enc, x, real=backend.features: passes.append(len(x)) or real(enc, x)
    got = client_losses(backend, pool, data)
    assert passes == [60]  # one pass of the shared encoder over the 3 clients' 60 images
    flat, labels = data.images.reshape(-1, 32, 32, 3), data.labels.reshape(-1)
    for n, m in enumerate(pool):
        whole = backend.logits(m, flat)
        if n != 2:
            assert np.array_equal(backend.head_logits(m[k:], StackedBackend.features(backend, m[:k], flat)), whole)
        z = whole.astype(np.float64)
        nll = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1) - z[np.arange(60), labels]
        np.testing.assert_allclose(got[:, n], nll.reshape(3, 20).mean(1), rtol=1e-6)


def test_sgd_trains_alike_on_both_backends(clients):
    keras.utils.set_random_seed(1)
    model = build_classifier(build_encoder("cnn", (32, 32, 3)), build_classifier_head("c", 256, 10))
    data = ClientArrays(clients.train.images[:3], clients.train.labels[:3])
    pool, ids, orders = stack_models([model.get_weights()]), np.zeros(3, np.int64), batch_orders(3, 20, 2, [0])
    local = LocalTraining(batch_size=10, learning_rate=0.05, optimizer="sgd")
    a = StackedBackend(model).train(pool, ids, data, orders, ["model", "head"], local)
    b = KerasBackend(model).train(pool, ids, data, orders, ["model", "head"], local)
    for x, y, start in zip(a, b, pool):
        np.testing.assert_allclose(x, y, atol=2e-5)
        assert not np.array_equal(x[0], start[0])  # every array moved


def _bn_classifier():
    """A small encoder with BatchNormalization (like the ResNets) and head c-1."""
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, strides=2)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    encoder = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x), name="encoder")
    return build_classifier(encoder, build_classifier_head("c-1", 8, 10))


def test_a_frozen_encoder_runs_in_inference_mode_and_keeps_its_batchnorm_statistics(clients):
    from cpcfl_tf.data.images import to_float
    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.clustered.backends import make_backend
    from cpcfl_tf.clustered.local import unstack

    keras.utils.set_random_seed(0)
    model = _bn_classifier()
    encoder = model.get_layer("encoder")
    images = to_float(clients.train.images[:3].reshape(-1, 32, 32, 3))
    encoder(images, training=True)  # moving statistics away from their initial 0 / 1
    start = model.get_weights()
    backend = make_backend(model)
    assert isinstance(backend, KerasBackend)
    k = backend.num_encoder
    data = ClientArrays(clients.train.images[:3], clients.train.labels[:3])
    orders, local = batch_orders(3, data.size, 2, [4]), LocalTraining(batch_size=8)
    trained = backend.train(stack_models([start]), np.zeros(3, np.int64), data, orders,
                            ["head", "head"], local)
    # Every encoder array, moving mean and variance included, is bitwise unchanged, and so
    # is the cluster model's encoder after the server averages the round.
    pooled = algorithm.aggregate(algorithm.ServerState(0, [start], k), trained,
                                 np.zeros(3, np.int64), [20, 20, 20])
    for weights in [unstack(trained, u) for u in range(3)] + pooled.models:
        assert all(np.array_equal(a, b) for a, b in zip(weights[:k], start[:k]))
    # The head trained on encoder(x, training=False), which differs from training mode.
    frozen = [encoder(to_float(data.images[u]), training=False) for u in range(3)]
    assert not np.allclose(frozen[0], encoder(to_float(data.images[0]), training=True), atol=1e-3)
    head = build_classifier_head("c-1", 8, 10)
    for u in range(3):
        head.set_weights(start[k:])
        adam = keras.optimizers.Adam(1e-3)
        for order in orders[:, u]:
            for lo in range(0, data.size, local.batch_size):
                idx = order[lo:lo + local.batch_size]
                with tf.GradientTape() as tape:
                    probs = head(tf.gather(frozen[u], idx), training=True)
                    loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                        data.labels[u, idx], probs))
                adam.apply(tape.gradient(loss, head.trainable_variables), head.trainable_variables)
        for a, b in zip(unstack(trained, u)[k:], head.get_weights()):
            np.testing.assert_allclose(a, b, atol=1e-6)


KEPT = dict(rounds=3, head_rounds=1, optimizer_state="client")
"""A run whose clients keep their Adam state between rounds (two tests read its record)."""


@pytest.fixture(scope="module")
def kept_run(clients, encoder):
    record, _ = run_federated(resolve(config(**KEPT)), clients, encoder_weights=encoder,
                              context=RunContext(verbose=0))
    return record


def test_clients_can_keep_their_adam_state_between_rounds(clients, encoder, tmp_path,
                                                          kept_run):
    kept, whole = config(**KEPT), kept_run
    fresh, _ = run_federated(resolve(config(rounds=3, head_rounds=1)), clients,
                             encoder_weights=encoder, context=RunContext(verbose=0))
    # Round 1 starts from a zero state either way; from round 2 the kept moments differ.
    assert whole.rounds[0] == fresh.rounds[0]
    assert whole.rounds[1:] != fresh.rounds[1:]

    class Stop(Exception):
        pass

    def stop(record, state):
        if record["round"] == 2:
            raise Stop

    with pytest.raises(Stop):
        run_federated(resolve(kept), clients, encoder_weights=encoder, context=RunContext(verbose=0),
                      checkpoint=tmp_path / "ckpt.npz", on_round=stop)
    resumed, _ = run_federated(resolve(kept), clients, encoder_weights=encoder, context=RunContext(verbose=0),
                               checkpoint=tmp_path / "ckpt.npz")
    assert resumed.rounds == whole.rounds and resumed.final == whole.final


def test_kept_adam_state_with_different_step_counts_trains_each_client_as_alone(clients):
    from cpcfl_tf.clustered.local import ClientMoments

    keras.utils.set_random_seed(2)
    model = build_classifier(build_encoder("cnn", (32, 32, 3)), build_classifier_head("c", 256, 10))
    data = ClientArrays(clients.train.images[:2], clients.train.labels[:2])
    pool, orders = stack_models([model.get_weights()]), batch_orders(2, 20, 1, [3])
    rng = np.random.default_rng(0)
    start = ClientMoments([0.01 * rng.random((2, *a.shape[1:]), np.float32) for a in pool],
                          [1e-4 * rng.random((2, *a.shape[1:]), np.float32) for a in pool],
                          np.array([0, 7]))  # the clients took part in different rounds
    backend, local = StackedBackend(model), LocalTraining(batch_size=10)
    together = start.subset(np.arange(2))
    both = backend.train(pool, np.zeros(2, np.int64), data, orders, ["model"], local, together)
    assert together.steps.tolist() == [2, 9]
    for u in range(2):
        alone = start.subset(np.array([u]))
        one = backend.train(pool, np.zeros(1, np.int64), data.subset(np.array([u])),
                            orders[:, u:u + 1], ["model"], local, alone)
        for a, b in zip(both, one):
            np.testing.assert_allclose(a[u], b[0], rtol=1e-5, atol=1e-7)
        for a, b in zip(together.m, alone.m):
            np.testing.assert_allclose(a[u], b[0], rtol=1e-5, atol=1e-9)


def test_kept_adam_state_trains_as_adam_written_in_numpy(clients):
    """A client resuming Adam from kept moments and step count 7: the stacked backend's
    weights against Kingma and Ba's update in NumPy (Keras' defaults: beta 0.9 / 0.999,
    epsilon 1e-7 outside the root), gradients of the plain Keras model."""
    from cpcfl_tf.clustered.local import ClientMoments

    keras.utils.set_random_seed(4)
    model = build_classifier(build_encoder("cnn", (32, 32, 3)), build_classifier_head("c", 256, 10))
    assert len(model.trainable_variables) == len(model.weights)  # no BatchNorm in the CNN
    data = ClientArrays(clients.train.images[:1], clients.train.labels[:1])
    pool, orders = stack_models([model.get_weights()]), batch_orders(1, 20, 1, [5])
    rng = np.random.default_rng(1)
    m = [0.01 * rng.standard_normal(a.shape).astype(np.float32) for a in pool]
    v = [1e-4 * rng.random(a.shape).astype(np.float32) for a in pool]
    kept = ClientMoments([a.copy() for a in m], [a.copy() for a in v], np.array([7]))
    got = StackedBackend(model).train(pool, np.zeros(1, np.int64), data, orders, ["model"],
                                      LocalTraining(batch_size=10), kept)

    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-7
    w = [a[0].astype(np.float64) for a in pool]
    m, v = [a[0].astype(np.float64) for a in m], [a[0].astype(np.float64) for a in v]
    for t, lo in enumerate(range(0, 20, 10), start=8):
        batch = orders[0, 0, lo:lo + 10]
        model.set_weights([a.astype(np.float32) for a in w])
        x = data.images[0, batch].astype(np.float32) / 255.0
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                data.labels[0, batch], probs))
        grads = [g.numpy().astype(np.float64)
                 for g in tape.gradient(loss, model.trainable_variables)]
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            w[i] = w[i] - alpha * m[i] / (np.sqrt(v[i]) + eps)
    assert kept.steps.tolist() == [9]
    for a, b, start in zip(got, w, pool):
        assert not np.array_equal(a[0], start[0])
        np.testing.assert_allclose(a[0], b, rtol=1e-4, atol=1e-6)
    for a, b in zip(kept.m, m):
        np.testing.assert_allclose(a[0], b, rtol=1e-4, atol=1e-7)


def test_cp_cfl_keeps_the_encoder_frozen_during_tc_then_trains_it(clients, encoder):
    seen = []
    run_federated(resolve(config(rounds=4, head_rounds=2)), clients, encoder_weights=encoder, context=RunContext(verbose=0),
                  on_round=lambda record, state: seen.append([m[:len(encoder)] for m in state.models]))
    for round_, models in enumerate(seen, start=1):
        same = all(np.array_equal(a, b) for m in models for a, b in zip(m, encoder))
        assert same == (round_ <= 2), round_


def test_encoder_epochs_0_keeps_the_encoder_fixed_after_tc_too(clients, encoder):
    seen = []
    run_federated(resolve(config(rounds=3, head_rounds=1, encoder_epochs=0)), clients,
                  encoder_weights=encoder, context=RunContext(verbose=0),
                  on_round=lambda record, state: seen.append(state.models))
    for models in seen:
        assert all(np.array_equal(a, b) for m in models for a, b in zip(m, encoder))
    assert not np.array_equal(seen[-1][0][-1], seen[0][0][-1])  # the heads do train


@pytest.mark.parametrize("backend", ["stacked", "keras"])
def test_encoder_epochs_1_trains_the_encoder_in_the_first_local_epoch_only(clients, encoder,
                                                                          backend):
    """Three local epochs with E_l,f = 1 leave the encoder where one epoch (the same
    batches) leaves it; the head goes on training."""
    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.clustered.backends import backend_of
    from cpcfl_tf.clustered.pool import build_template, initial_pool

    run = resolve(config(local_epochs=3, encoder_epochs=1, head_rounds=0, backend=backend))
    fl = run.federated
    template = build_template(run, clients.train.images.shape[2:], clients.num_classes)
    trainer = backend_of(template, fl)
    pool = stack_models(initial_pool(run, template, encoder, seed=0, attempt=0))
    ids = np.arange(9) % fl.num_clusters
    orders = batch_orders(9, clients.train.size, 3, [0, 0, 1])
    plan = algorithm.plan_round(run, 0, 0, 0, 9)
    assert algorithm.epoch_parts(fl, plan) == ["model", "head", "head"]
    local = LocalTraining.of(fl)
    three = trainer.train(pool, ids, clients.train, orders, ["model", "head", "head"], local)
    one = trainer.train(pool, ids, clients.train, orders[:1], ["model"], local)
    n = len(encoder)
    for a, b in zip(three[:n], one[:n]):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(three[n], one[n])
    assert not np.array_equal(one[0], pool[0])  # the first epoch did train the encoder


def test_cp_cfl_and_ifca_recover_the_true_groups(clients, encoder):
    cp, _ = run_federated(resolve(config(rounds=4, head_rounds=1)), clients,
                          encoder_weights=encoder, context=RunContext(verbose=0))
    ifca, _ = run_federated(resolve(config(method="ifca", pretraining="none", rounds=4)), clients,
                            context=RunContext(verbose=0))
    assert cp.final.ari == 1.0 and ifca.final.ari == 1.0
    fedavg, state = run_federated(resolve(config(method="fedavg", pretraining="none", rounds=2)),
                                  clients, context=RunContext(verbose=0))
    assert len(state.models) == 1 and fedavg.final.ari == 0.0


def test_a_run_records_the_contract(clients, encoder):
    record, _ = run_federated(resolve(config(rounds=4, head_rounds=1, report_every=2)), clients,
                              encoder_weights=encoder, context=RunContext(verbose=0))
    record = record.to_json()  # the contract is the JSON
    assert [r["round"] for r in record["rounds"]] == [1, 2, 3, 4]
    assert all(0 <= r["accuracy"] <= 1 and len(r["cluster_ids"]) == 9 for r in record["rounds"])
    assert "f1_macro" in record["rounds"][1] and "f1_macro" not in record["rounds"][0]
    final = record["final"]
    for key in ("accuracy", "f1_macro", "f1_weighted", "auroc_ovr_macro", "auroc_ovr_weighted",
                "auroc_ovo_macro", "auroc_ovo_weighted", "ari", "restarts", "bytes_down",
                "bytes_up"):
        assert key in final, key
    # 4 rounds x 9 clients: the pool of 3 down (the Tc round too), one model up
    assert final["bytes_down"] == 3 * final["model_bytes"] * 4 * 9
    assert final["bytes_up"] == final["model_bytes"] * 4 * 9
    assert final["model_bytes"] == 4 * sum(int(np.prod(w.shape)) for w in encoder) + 4 * (
        256 * 10 + 10)  # float32 encoder + head c
    assert record["config"]["federated"]["head_rounds"] == 1
    assert record["clients"][0]["group"] == 0


def test_the_same_seeds_give_the_same_run_whatever_the_process_did_before(clients, encoder):
    # The first run builds its classifier template and draws its pool afresh; the second
    # takes both from the process's caches (pool.template_for, pool.drawn_classifier)
    # after Python's and NumPy's global streams moved: a run reads only its own seeded
    # streams, so skipping a build changes nothing.
    import random

    from cpcfl_tf.clustered import pool

    pool._TEMPLATES.clear()
    pool._DRAWN.clear()
    runs = []
    for _ in range(2):
        runs.append(run_federated(resolve(config(rounds=3, head_rounds=1)), clients,
                                  encoder_weights=encoder, context=RunContext(verbose=0))[0].rounds)
        random.random(), np.random.random()
    assert pool._TEMPLATES and runs[0] == runs[1]
    other = run_federated(resolve(config(rounds=3, head_rounds=1)), clients,
                          encoder_weights=encoder, context=RunContext(verbose=0), train_seed=1)[0].rounds
    assert other != runs[0]


def test_eval_every_thins_the_scoring_and_changes_nothing_else(clients, tmp_path):
    # Scoring every client is most of a round with many clients taking part a few at a
    # time; eval_every skips it between rounds, keeps the rounds the reports read: the
    # quarters the tables show (2, 4, 6, 8 of 8), every report_every round, the last.
    every = config(method="ifca", pretraining="none", rounds=8, report_every=5,
                   participation=1 / 3)
    thinned = config(method="ifca", pretraining="none", rounds=8, report_every=5,
                     participation=1 / 3, eval_every=3)
    full, _ = run_federated(resolve(every), clients, context=RunContext(verbose=0))
    sparse, _ = run_federated(resolve(thinned), clients, context=RunContext(verbose=0))
    assert thinned.federated.quarters == [2, 4, 6, 8]
    assert [r.round for r in sparse.rounds if r.accuracy is not None] == [2, 3, 4, 5, 6, 8]
    assert all(sparse.accuracy_at(t) is not None for t in thinned.federated.quarters)
    for a, b in zip(full.rounds, sparse.rounds):  # scoring never feeds back into training
        assert a.cluster_ids == b.cluster_ids
        if b.accuracy is not None:
            assert (a.accuracy, a.scores) == (b.accuracy, b.scores)
    assert sparse.final == full.final and sparse.best_accuracy() <= full.best_accuracy()
    # the record leaves the field out at its default: earlier records stay byte for byte

    assert "eval_every" not in every.to_dict()["federated"]
    assert thinned.to_dict()["federated"]["eval_every"] == 3
    with pytest.raises(UserError, match="eval_every"):
        config(eval_every=0)


def test_partial_participation_and_global_encoder(clients, encoder):
    record, state = run_federated(resolve(
        config(rounds=3, head_rounds=1, participation=1 / 3, global_encoder=True)), clients,
        encoder_weights=encoder, context=RunContext(verbose=0))
    final = record.final
    assert final.bytes_up == 3 * 3 * final.model_bytes  # 3 of 9 clients, 3 rounds
    assert len(encoder) == 10  # 4 convolutions and a dense layer, kernel and bias each
    models = state.models
    for model in models[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(model[:10], models[0][:10]))
        assert not np.array_equal(model[10], models[0][10])  # heads stay per cluster


def test_ifca_restarts_under_partial_participation(clients, capsys):
    """IFCA's restart check, and its notice and progress lines, with clients not drawn yet
    (each crashed on their -1 ids); the final ARI is over the clients that took part."""
    record, _ = run_federated(resolve(config(method="ifca", pretraining="none", rounds=6,
                                     restart_round=2, participation=0.2)), clients, context=RunContext(verbose=1))
    assert len(record.rounds) == 6
    notices = [l for l in capsys.readouterr().out.splitlines() if "clustering failed" in l]
    assert len(notices) == record.final.restarts > 0
    import re
    sizes = [int(n) for n in re.search(r"\(\[(.*)\] clients", notices[0])[1].split(",")]
    assert 2 <= sum(sizes) <= 4  # 2 clients a round for 2 rounds: not all 9 have a cluster
    ids = np.array(record.rounds[-1].cluster_ids)
    assert (ids == -1).any()  # someone was never drawn in the kept attempt
    from cpcfl_tf.clustered.metrics import cluster_ari
    assert record.final.ari == cluster_ari(clients.groups, ids)


class _Stop(Exception):
    pass


def test_an_ifca_restart_starts_a_new_pool_and_a_resume_after_it_gives_the_same_run(
        clients, tmp_path):
    """The restart branch: a failed clustering at ``restart_round`` starts attempt k+1 from
    its own new pool with the history cleared; a run killed after a restart resumes to the
    uninterrupted record. Two clusters of 9 clients with ``min_cluster_share`` 1 always
    fail (one cluster holds fewer than 4.5), so every attempt restarts."""
    from cpcfl_tf.clustered.pool import build_template, initial_pool

    c = config(method="ifca", pretraining="none", num_clusters=2, rounds=3, restart_round=2,
               max_restarts=2, min_cluster_share=1.0)
    seen = []  # (round, pool) after every round (and restart decision)
    whole, _ = run_federated(resolve(c), clients, context=RunContext(verbose=0),
                             on_round=lambda r, state: seen.append((r["round"], state.models)))
    assert whole.final.restarts == 2
    assert [r for r, _ in seen] == [1, 2, 1, 2, 1, 2, 3]  # each attempt counts from 1
    assert [r.round for r in whole.rounds] == [1, 2, 3]  # only the kept attempt
    assert whole.final.bytes_up == (3 + 2 * 2) * 9 * whole.final.model_bytes
    run = resolve(c)
    template = build_template(run, clients.train.images.shape[2:], clients.num_classes)
    for at, attempt in ((1, 1), (3, 2)):  # the pool right after each restart: the attempt's own
        fresh = initial_pool(run, template, None, seed=c.seed, attempt=attempt)
        for got, want in zip(seen[at][1], fresh):
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
    first = initial_pool(run, template, None, seed=c.seed, attempt=0)
    assert not np.array_equal(first[0][0], seen[1][1][0][0])

    checkpoint, count = tmp_path / "run.npz", []

    def stop_after_the_first_restart(record, state):
        count.append(record["round"])
        if count == [1, 2, 1]:
            raise _Stop

    with pytest.raises(_Stop):
        run_federated(resolve(c), clients, checkpoint=checkpoint, context=RunContext(verbose=0),
                      on_round=stop_after_the_first_restart)
    resumed, _ = run_federated(resolve(c), clients, checkpoint=checkpoint, context=RunContext(verbose=0))
    assert resumed.rounds == whole.rounds and resumed.final == whole.final


def test_the_initial_pool_is_what_a_seeded_keras_build_draws_whatever_ran_before():
    """Each pool model is the classifier Keras builds after set_random_seed(init_seed),
    the same whatever was drawn before in the process (the draws are kept in memory:
    drawn_classifier), and each call gets arrays of its own."""
    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.clustered.pool import build_template, initial_pool

    def built(fl, init):  # what the pool must hold, built here
        keras.utils.set_random_seed(init)
        encoder = build_encoder(fl.encoder, (32, 32, 3))
        return build_classifier(encoder, build_classifier_head(fl.head, 256, 10)).get_weights()

    for head in ("c", "c-1"):
        run = resolve(config(method="ifca", pretraining="none", head=head))
        fl = run.federated
        template = build_template(run, (32, 32, 3), 10)
        for seed, attempt in ((0, 0), (0, 1), (4, 0), (0, 0)):
            np.random.default_rng().random(3), tf.random.uniform((3,)), keras.random.normal((2,))
            pool = initial_pool(run, template, None, seed=seed, attempt=attempt)
            for n, weights in enumerate(pool):
                want = built(fl, algorithm.init_seed(seed, attempt, n))
                assert [w.shape for w in weights] == [w.shape for w in want]
                assert all(np.array_equal(a, b) for a, b in zip(weights, want)), (head, seed, n)
            assert not np.array_equal(pool[0][0], pool[1][0])
            pool[0][0][...] = 7  # a caller changing its arrays changes no later pool
        k = len(template.get_layer("encoder").weights)
        encoder = [np.full_like(w, 0.5) for w in pool[0][:k]]
        with_encoder = initial_pool(run, template, encoder, seed=0, attempt=0)
        for n, weights in enumerate(with_encoder):
            assert all(np.array_equal(a, b) for a, b in zip(weights[:k], encoder))
            assert all(np.array_equal(a, b) for a, b in zip(
                weights[k:], built(fl, algorithm.init_seed(0, 0, n))[k:]))


def test_client_test_labels_reach_neither_selection_nor_training(clients):
    """Selection uses the clients' training data and evaluation their test data: with the
    test labels shuffled, cluster ids and weights stay bit for bit, only scores move."""
    import dataclasses

    rng = np.random.default_rng(3)
    shuffled = dataclasses.replace(clients, test=dataclasses.replace(
        clients.test, labels=rng.permutation(clients.test.labels.reshape(-1))
        .reshape(clients.test.labels.shape)))
    c = config(method="ifca", pretraining="none", rounds=3)
    (real, real_state), (fake, fake_state) = (run_federated(resolve(c), data, context=RunContext(verbose=0))
                                              for data in (clients, shuffled))
    assert [r.cluster_ids for r in real.rounds] == [r.cluster_ids for r in fake.rounds]
    for a, b in zip(real_state.models, fake_state.models):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert real.final.accuracy != fake.final.accuracy  # the test labels were used: to score


def test_divergence_is_a_clear_error(clients):
    with pytest.raises(UserError, match=r"diverged .*federated\.learning_rate"):
        run_federated(resolve(config(method="fedavg", pretraining="none", rounds=2, learning_rate=1e30)),
                      clients, context=RunContext(verbose=0))


RUNNER = textwrap.dedent("""
    import sys
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.clustered.clients import clients_for
    from cpcfl_tf.clustered.simulator import run_federated
    from cpcfl_tf.plan.resolve import resolve
    c = get_preset("smoke").with_overrides(
        federated={"method": "ifca", "pretraining": "none", "rounds": 6})
    run_federated(resolve(c), clients_for(c), checkpoint=sys.argv[1])  # a line per round
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
    assert proc.returncode == -signal.SIGKILL  # killed, not finished
    import json
    with np.load(checkpoint) as saved:  # the round whose line was printed, or the next
        assert json.loads(str(saved["__meta__"]))["progress"]["round"] in (3, 4)
    c = config(method="ifca", pretraining="none", rounds=6)
    resumed, _ = run_federated(resolve(c), clients, checkpoint=checkpoint, context=RunContext(verbose=0))
    whole, _ = run_federated(resolve(c), clients, context=RunContext(verbose=0))
    assert resumed.rounds == whole.rounds and resumed.final == whole.final


def test_a_checkpoint_of_another_run_is_refused(clients, tmp_path):
    checkpoint = tmp_path / "run.npz"
    run_federated(resolve(config(method="fedavg", pretraining="none", rounds=1, head_rounds=0)),
                  clients, checkpoint=checkpoint, context=RunContext(verbose=0))
    with pytest.raises(UserError, match="different run"):
        run_federated(resolve(config(method="fedavg", pretraining="none", rounds=2)), clients,
                      checkpoint=checkpoint, context=RunContext(verbose=0))
    checkpoint.write_bytes(b"garbage")
    with pytest.raises(UserError, match="run.npz is damaged .*delete it to start the run over"):
        run_federated(resolve(config(method="fedavg", pretraining="none", rounds=1, head_rounds=0)),
                      clients, checkpoint=checkpoint, context=RunContext(verbose=0))


def test_a_checkpoint_from_another_starting_encoder_is_refused(clients, encoder, tmp_path):
    checkpoint, c = tmp_path / "run.npz", config(method="fedavg", rounds=2, head_rounds=1)
    run_federated(resolve(c), clients, encoder_weights=encoder, checkpoint=checkpoint, context=RunContext(verbose=0))
    other = [w + np.float32(1e-3) if i == 0 else w for i, w in enumerate(encoder)]
    with pytest.raises(UserError, match="different run"):
        run_federated(resolve(c), clients, encoder_weights=other, checkpoint=checkpoint, context=RunContext(verbose=0))


def test_ifca_fedavg_starts_from_the_fedavg_models_encoder(clients):
    from cpcfl_tf.clustered.starting import fedavg_encoder

    encoder, fedavg = fedavg_encoder(config(rounds=2, head_rounds=0), clients, context=RunContext(verbose=0))
    assert len(encoder) == 10 and fedavg.config.federated.num_clusters == 1
    seen = []
    run_federated(resolve(config(method="ifca", pretraining="fedavg", rounds=2, head_rounds=0)),
                  clients, encoder_weights=encoder, context=RunContext(verbose=0),
                  on_round=lambda record, state: seen.append(state))
    assert len(seen[0].models) == 3


def test_a_run_shows_one_progress_line_per_round_in_a_log(clients, capsys):
    import re

    run_federated(resolve(config(method="fedavg", pretraining="none", rounds=3, head_rounds=0)),
                  clients, context=RunContext(verbose=1))
    lines = [l for l in capsys.readouterr().out.splitlines() if "round" in l]
    assert len(lines) == 3  # not a terminal: a line per round, no carriage returns
    for t, line in enumerate(lines, 1):
        assert re.fullmatch(rf"  round {t}/3: accuracy 0\.\d{{4}}, clusters \[9\], "
                            r"\d+:\d\d:\d\d elapsed, ETA \d+:\d\d:\d\d", line), line


def test_training_in_chunks_of_clients_gives_the_unchunked_run(clients, encoder, kept_run,
                                                                monkeypatch):
    from cpcfl_tf.clustered.stacked import StackedBackend

    steps, train = [], StackedBackend.train

    def counted(self, pool, ids, *args):
        steps.append(len(ids))
        return train(self, pool, ids, *args)

    monkeypatch.setattr(StackedBackend, "train", counted)
    whole = kept_run
    chunked, _ = run_federated(resolve(config(**KEPT)), clients, encoder_weights=encoder,
                               context=RunContext(verbose=0, max_clients=4))
    assert steps == [4, 4, 1] * 3  # 9 clients a round, 3 rounds
    assert chunked.rounds == whole.rounds and chunked.final == whole.final


@pytest.mark.parametrize("kind", ["stacked", "keras"])
def test_jit_compiled_steps_train_like_the_default_and_repeat_bit_for_bit(clients, kind):
    """federated.jit_compile: XLA's kernels give other last bits, not another training."""
    from cpcfl_tf.clustered.backends import make_backend

    keras.utils.set_random_seed(2)
    model = build_classifier(build_encoder("cnn", (32, 32, 3)), build_classifier_head("c-1", 256, 10))
    data = ClientArrays(clients.train.images[:3], clients.train.labels[:3])
    pool = stack_models([model.get_weights()])
    ids, orders, local = np.zeros(3, np.int64), batch_orders(3, 20, 2, [0]), LocalTraining(batch_size=10)
    default, jit = make_backend(model, kind), make_backend(model, kind, jit_compile=True)
    assert default is not jit
    a = default.train(pool, ids, data, orders, ["model", "head"], local)
    b, c = (jit.train(pool, ids, data, orders, ["model", "head"], local) for _ in range(2))
    for x, y, z, start in zip(a, b, c, pool):
        np.testing.assert_allclose(x, y, atol=2e-5)
        assert np.array_equal(y, z)
        assert not np.array_equal(y, start)
    start = [w[0] for w in pool]
    np.testing.assert_allclose(client_losses(jit, [start], data),
                               client_losses(default, [start], data), rtol=1e-5)


def test_cp_cfl_restart_that_never_restarts_is_cp_cfl_and_the_diagnostic_changes_nothing(
        clients, encoder):
    """Attempt 0 of CP-CFL+restart draws what CP-CFL draws; with groups found its failure
    test never fires, so the two runs are one, round for round. The selection diagnostic
    records the pool losses of rounds Tc + 1 .. Tc + K and leaves every result as it was."""
    from cpcfl_tf.clustered.backends import backend_of
    from cpcfl_tf.clustered.pool import build_template

    plain, _ = run_federated(resolve(config(rounds=4, head_rounds=1)), clients,
                             encoder_weights=encoder, context=RunContext(verbose=0))
    variant, _ = run_federated(resolve(config(method="cp-cfl-restart", rounds=4, head_rounds=1,
                                      restart_round=1)), clients, encoder_weights=encoder,
                               context=RunContext(verbose=0, diagnose=2))
    assert variant.final.ari == 1.0 and variant.final.restarts == 0
    assert [r.cluster_ids for r in variant.rounds] == [r.cluster_ids for r in plain.rounds]
    assert [r.accuracy for r in variant.rounds] == [r.accuracy for r in plain.rounds]
    assert variant.final.accuracy == plain.final.accuracy
    assert [r.selection is not None for r in variant.rounds] == [False, True, True, False]
    # round 2's losses are those of round 1's pool on each client's training data
    run = resolve(config(rounds=4, head_rounds=1))
    fl = run.federated
    template = build_template(run, clients.train.images.shape[2:], clients.num_classes)
    rounds = []
    run_federated(resolve(config(rounds=2, head_rounds=1)), clients, encoder_weights=encoder,
                  context=RunContext(verbose=0), on_round=lambda record, state: rounds.append(state.models))
    losses = client_losses(backend_of(template, fl), rounds[0], clients.train)
    selection = variant.rounds[1].selection
    np.testing.assert_allclose(selection["losses"], losses, rtol=1e-5)
    assert selection["clients"] == list(range(9))
    assert np.argmin(selection["losses"], 1).tolist() == variant.rounds[1].cluster_ids
    assert min(selection["margins"]) >= 0


def test_a_run_traces_the_forward_pass_once_and_a_second_run_traces_nothing(
        clients, encoder, caplog):
    """The Tc phase changes the clusters' sizes every round; the forward pass used to be
    traced again for every new number of images (TensorFlow's retracing warning in the
    first run). Its number of images is now left open in one trace, and the logits are
    those of a trace of the exact shape, to the bit."""
    from cpcfl_tf.data.images import to_float
    from cpcfl_tf.clustered.backends import backend_of
    from cpcfl_tf.clustered.stacked import stacked_logits
    from cpcfl_tf.clustered.pool import build_template

    c = config(rounds=6, head_rounds=4)
    run = resolve(c)
    fl = run.federated
    template = build_template(run, clients.train.images.shape[2:], clients.num_classes)
    backend = backend_of(template, fl)
    functions = {"logits": backend._logits, "gradients": backend._grads}
    with caplog.at_level("WARNING", logger="tensorflow"):
        first, _ = run_federated(resolve(c), clients, encoder_weights=encoder, context=RunContext(verbose=0))
        sizes = {tuple(np.bincount(r.cluster_ids, minlength=3)) for r in first.rounds}
        assert len(sizes) > 2  # the clusters did change size
        assert functions["logits"].experimental_get_tracing_count() == 1
        counts = {k: f.experimental_get_tracing_count() for k, f in functions.items()}
        run_federated(resolve(config(rounds=6, head_rounds=4)), clients, encoder_weights=encoder,
                      context=RunContext(verbose=0), train_seed=7)
        assert {k: f.experimental_get_tracing_count() for k, f in functions.items()} == counts
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]
    exact = tf.function(lambda params, x: stacked_logits(backend.layers, params, to_float(x)))
    weights = template.get_weights()
    params = [tf.constant(a[None]) for a in weights]
    flat = clients.test.images.reshape(-1, *clients.test.images.shape[2:])
    for count in (1, 7, len(flat)):
        x = tf.constant(flat[None, :count])
        assert np.array_equal(backend._logits(params, x).numpy(), exact(params, x).numpy())


def test_a_run_resumed_under_partial_participation_keeps_every_clients_cluster(
        clients, tmp_path):
    """A third of the clients take part each round, so after a resume most clients'
    last cluster is known only from the checkpoint: a resume that forgot it would record
    -1 (or another id) for them and another final ARI."""
    from helpers import Killed, kill_after

    c = config(method="ifca", pretraining="none", rounds=6, participation=1 / 3)
    checkpoint = tmp_path / "run.npz"
    with pytest.raises(Killed):
        run_federated(resolve(c), clients, checkpoint=checkpoint, context=RunContext(verbose=0), on_round=kill_after(3))
    resumed, _ = run_federated(resolve(c), clients, checkpoint=checkpoint, context=RunContext(verbose=0))
    whole, _ = run_federated(resolve(c), clients, context=RunContext(verbose=0))
    assert [r.cluster_ids for r in resumed.rounds] == [r.cluster_ids for r in whole.rounds]
    assert resumed.rounds == whole.rounds and resumed.final == whole.final
    # some client took part before the kill and not in the round after: its id there is
    # the checkpoint's
    before, after = whole.rounds[2].cluster_ids, whole.rounds[3].cluster_ids
    assert any(b >= 0 and a == b for a, b in zip(after, before))
    assert resumed.final.ari == whole.final.ari


def test_aggregation_leaves_the_part_the_clients_keep_as_it_was():
    """A personalized method's kept arrays are never sent: by hand, the shared array is
    the size-weighted mean (1 * 1 + 3 * 5) / 4 = 4, the kept one the server's own."""
    from cpcfl_tf.clustered.algorithm import ServerState, aggregate

    state = ServerState(0, [[np.zeros(2, np.float32), np.full(2, 7.0, np.float32)]], 1)
    weights = [np.array([[1.0, 1.0], [5.0, 5.0]], np.float32),
               np.array([[2.0, 2.0], [9.0, 9.0]], np.float32)]
    new = aggregate(state, weights, np.zeros(2, np.int64), [1.0, 3.0], kept=(1,))
    np.testing.assert_array_equal(new.models[0][0], [4.0, 4.0])
    np.testing.assert_array_equal(new.models[0][1], [7.0, 7.0])


def test_client_parts_hold_every_clients_part_and_compose_its_model():
    from cpcfl_tf.clustered.local import ClientParts

    model = [np.zeros(2, np.float32), np.ones(3, np.float32)]
    parts = ClientParts.of(model, (1,), 4)
    assert parts.nbytes == 4 * 3 * 4  # four clients' head of three float32
    trained = [np.full((2, 2), 5.0), np.stack([np.full(3, 2.0), np.full(3, 3.0)])]
    parts.put(np.array([1, 3]), trained)
    composed = parts.models([np.full(2, 9.0), np.zeros(3)], np.array([0, 1, 3]))
    np.testing.assert_array_equal(composed[0], np.full((3, 2), 9.0))  # the shared part
    np.testing.assert_array_equal(composed[1], [np.ones(3), np.full(3, 2.0), np.full(3, 3.0)])
    one = parts.model([np.full(2, 9.0), np.zeros(3)], 3)  # one client's, without copies
    np.testing.assert_array_equal(one[1], np.full(3, 3.0))
    assert np.shares_memory(one[1], parts.arrays[0])


@pytest.mark.parametrize("method", ["fedper", "fedrep", "lg-fedavg"])
def test_personalized_methods_keep_each_clients_part_and_send_the_rest(clients, tmp_path,
                                                                       method):
    """FedPer and FedRep keep each client's head, LG-FedAvg its encoder, on every client
    whether it takes part or not; the server's copy of that part is never averaged, what
    is sent up is the rest (bytes counted by hand), what is kept is counted as never
    sent; a killed run resumes to the whole run."""

    from helpers import Killed, kill_after

    epochs = {"local_epochs": 2} if method == "fedrep" else {}  # a head epoch, then the encoder's
    c = config(method=method, pretraining="none", rounds=3, participation=1 / 3, **epochs)
    checkpoint = tmp_path / "run.npz"
    whole, state = run_federated(resolve(c), clients, checkpoint=checkpoint,
                                 context=RunContext(verbose=0))
    model, k = state.models[0], state.num_encoder
    kept = range(k, len(model)) if method != "lg-fedavg" else range(k)
    shared = sum(a.nbytes for i, a in enumerate(model) if i not in kept)
    assert whole.final.bytes_up == whole.final.bytes_down == 3 * 3 * shared  # 3 a round
    own = sum(model[i].nbytes for i in kept)
    assert whole.final.bytes_kept == clients.train.num_clients * own
    assert whole.to_json()["final"]["bytes_kept"] == whole.final.bytes_kept
    with np.load(checkpoint) as data:
        parts = {i: data[f"kept_{i}"] for i in kept}
    never = [u for u, cluster in enumerate(whole.rounds[-1].cluster_ids) if cluster < 0]
    took = [u for u in range(clients.train.num_clients) if u not in never]
    assert never and took  # 9 clients, 3 a round, 3 rounds: some never drawn
    for i in kept:  # never averaged: the untouched clients' part is the server's own
        assert parts[i].shape[0] == clients.train.num_clients
        for u in never:
            np.testing.assert_array_equal(parts[i][u], model[i])
    assert all(not np.array_equal(parts[kept[-1]][u], model[kept[-1]]) for u in took)
    # Each client is scored with its own model: the shared part and its kept one.
    from cpcfl_tf.clustered.pool import template_for
    from cpcfl_tf.data.images import to_float

    keras_model = template_for(resolve(c), clients.test.images.shape[2:], clients.num_classes)
    right = []
    for u in range(clients.test.num_clients):
        keras_model.set_weights([parts[i][u] if i in kept else a for i, a in enumerate(model)])
        logits = np.asarray(keras_model(to_float(clients.test.images[u]), training=False))
        right.append(np.mean(logits.argmax(axis=1) == clients.test.labels[u]))
    assert whole.final.accuracy == pytest.approx(np.mean(right), abs=1e-9)
    if method == "fedper":
        again = tmp_path / "again.npz"
        with pytest.raises(Killed):
            run_federated(resolve(c), clients, checkpoint=again, context=RunContext(verbose=0),
                          on_round=kill_after(2))
        resumed, _ = run_federated(resolve(c), clients, checkpoint=again,
                                   context=RunContext(verbose=0))
        assert resumed.rounds == whole.rounds and resumed.final == whole.final
        # Trained two clients a step (each from its own model): the same run.
        chunked, _ = run_federated(resolve(c), clients, context=RunContext(verbose=0, max_clients=2))
        assert chunked.rounds == whole.rounds and chunked.final == whole.final


def _tiny_classifier(seed: int):
    """Flatten -> Dense(3, relu) as the encoder, Dense(2, softmax) as the head: small
    enough to train by hand in NumPy, and stackable."""
    keras.utils.set_random_seed(seed)
    encoder = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(),
                                keras.layers.Dense(3, activation="relu")], name="encoder")
    head = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")],
                            name="head")
    return build_classifier(encoder, head)


def _numpy_sgd(model, images, labels, orders, parts, lr, batch, lam=0.0, anchor=None):
    """The local objective worked out by hand: mean cross-entropy of one client's batches
    (plus lam / 2 * ||w - anchor||^2), plain SGD, each epoch updating only the part it
    names (the encoder's two arrays, the head's two, or all four)."""
    w = [a.astype(np.float64) for a in model]
    for order, part in zip(orders, parts):
        for lo in range(0, len(order), batch):
            idx = order[lo:lo + batch]
            x = images[idx].reshape(len(idx), -1) / 255.0
            onehot = np.eye(2)[labels[idx]]
            z = x @ w[0] + w[1]
            h = np.maximum(z, 0)
            logits = h @ w[2] + w[3]
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            d = (p - onehot) / len(idx)
            dz = (d @ w[2].T) * (z > 0)
            grads = [x.T @ dz, dz.sum(0), h.T @ d, d.sum(0)]
            if lam:
                grads = [g + lam * (a - b) for g, a, b in zip(grads, w, anchor)]
            trained = {"encoder": (0, 1), "head": (2, 3), "model": (0, 1, 2, 3)}[part]
            for i in trained:
                w[i] = w[i] - lr * grads[i]
    return w


@pytest.mark.parametrize("backend", [StackedBackend, KerasBackend])
def test_fedreps_epochs_train_the_head_then_the_encoder_under_it_as_worked_in_numpy(backend):
    """FedRep's local epochs (rep_epochs = 1 of E = 3): two of the head on the frozen
    encoder, then one of the encoder under the fixed head, against SGD worked out by hand;
    the encoder does not move in the head epochs, nor the head in the encoder's."""
    model = _tiny_classifier(4)
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (2, 12, 4, 4, 1), dtype=np.uint8)
    labels = rng.integers(0, 2, (2, 12)).astype(np.int32)
    data = ClientArrays(images, labels)
    start = model.get_weights()
    orders = batch_orders(2, 12, 3, [4])
    local = LocalTraining(batch_size=4, learning_rate=0.5, optimizer="sgd")
    parts = ["head", "head", "encoder"]
    trained = backend(model).train(stack_models([start]), np.zeros(2, np.int64), data, orders,
                                   parts, local)
    for u in range(2):
        want = _numpy_sgd(start, images[u], labels[u], orders[:, u], parts, 0.5, 4)
        for got, expected in zip(trained, want):
            np.testing.assert_allclose(got[u], expected, atol=1e-5)
    heads_only = backend(model).train(stack_models([start]), np.zeros(2, np.int64), data,
                                      orders[:2], parts[:2], local)
    for i in (0, 1):  # the head epochs leave the encoder bitwise as it was
        assert np.array_equal(heads_only[i][0], start[i])
    for i in (2, 3):  # the encoder's epoch leaves the head where the head epochs put it
        assert np.array_equal(trained[i], heads_only[i])


@pytest.mark.parametrize("backend", [StackedBackend, KerasBackend])
def test_the_proximal_term_pulls_towards_the_anchor_as_worked_in_numpy(backend):
    """Ditto's personal objective F_k(v) + lambda / 2 ||v - w||^2 (lambda = 1, w the
    anchor model, not where the client starts), against SGD worked out by hand; with
    lambda = 0 it is the plain objective, and the anchor is required when lambda > 0."""
    model = _tiny_classifier(5)
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (2, 8, 4, 4, 1), dtype=np.uint8)
    labels = rng.integers(0, 2, (2, 8)).astype(np.int32)
    data = ClientArrays(images, labels)
    start = model.get_weights()
    anchor = [a + rng.standard_normal(a.shape).astype(np.float32) for a in start]
    orders = batch_orders(2, 8, 2, [5])
    prox = LocalTraining(batch_size=4, learning_rate=0.3, optimizer="sgd", prox=1.0)
    pool = stack_models([start])
    trained = backend(model).train(pool, np.zeros(2, np.int64), data, orders, ["model"] * 2,
                                   prox, anchor=anchor)
    plain = backend(model).train(pool, np.zeros(2, np.int64), data, orders, ["model"] * 2,
                                 dataclasses.replace(prox, prox=0.0))
    for u in range(2):
        want = _numpy_sgd(start, images[u], labels[u], orders[:, u], ["model"] * 2, 0.3, 4,
                          lam=1.0, anchor=anchor)
        free = _numpy_sgd(start, images[u], labels[u], orders[:, u], ["model"] * 2, 0.3, 4)
        for got, expected, alone, unpulled in zip(trained, want, plain, free):
            np.testing.assert_allclose(got[u], expected, atol=1e-5)
            np.testing.assert_allclose(alone[u], unpulled, atol=1e-5)
    assert not np.allclose(trained[0], plain[0], atol=1e-3)  # the pull is not negligible
    with pytest.raises(ValueError, match="anchor"):
        backend(model).train(pool, np.zeros(2, np.int64), data, orders, ["model"] * 2, prox)


def _scored_with(c, clients, models):
    """The mean client accuracy of each client u scored with ``models[u]``, by Keras."""
    from cpcfl_tf.clustered.pool import template_for
    from cpcfl_tf.data.images import to_float

    keras_model = template_for(resolve(c), clients.test.images.shape[2:], clients.num_classes)
    right = []
    for u, weights in enumerate(models):
        keras_model.set_weights(weights)
        logits = np.asarray(keras_model(to_float(clients.test.images[u]), training=False))
        right.append(np.mean(logits.argmax(axis=1) == clients.test.labels[u]))
    return float(np.mean(right))


@pytest.fixture(scope="module")
def fedavg_run(clients):
    """FedAvg from random weights, 3 rounds of a third of the clients, batches of 8 of
    their 20 images (so that a batch order shows): what Ditto's and FedAvg+FT's shared
    model must be."""
    c = config(method="fedavg", pretraining="none", rounds=3, participation=1 / 3,
               batch_size=8)
    return run_federated(resolve(c), clients, context=RunContext(verbose=0))


def test_dittos_global_model_is_fedavgs_and_each_client_is_scored_with_its_personal_one(
        clients, tmp_path, fedavg_run):
    """Ditto sends the shared model whole and the server averages it as FedAvg does (the
    same bits, the same bytes); each client keeps a personal model (counted as never
    sent), trained only in the rounds it takes part, and is scored with it."""
    c = config(method="ditto", pretraining="none", rounds=3, participation=1 / 3,
               batch_size=8)
    checkpoint = tmp_path / "ditto.npz"
    ditto, state = run_federated(resolve(c), clients, checkpoint=checkpoint,
                                 context=RunContext(verbose=0))
    fedavg, fedavg_state = fedavg_run
    assert all(np.array_equal(a, b) for a, b in zip(state.models[0], fedavg_state.models[0]))
    size = sum(a.nbytes for a in state.models[0])
    assert ditto.final.bytes_up == fedavg.final.bytes_up == 3 * 3 * size
    assert ditto.final.bytes_kept == clients.train.num_clients * size
    with np.load(checkpoint) as data:
        personal = [data[f"kept_{i}"] for i in range(len(state.models[0]))]
    models = [[a[u] for a in personal] for u in range(clients.train.num_clients)]
    never = [u for u, cluster in enumerate(ditto.rounds[-1].cluster_ids) if cluster < 0]
    took = [u for u in range(clients.train.num_clients) if u not in never]
    assert never and took
    for u in never[1:]:  # never trained: every one still the starting model
        assert all(np.array_equal(a, b) for a, b in zip(models[u], models[never[0]]))
    for u in took:  # trained: its own, neither the start nor the shared model
        assert not np.array_equal(models[u][0], models[never[0]][0])
        assert not np.array_equal(models[u][0], state.models[0][0])
    assert ditto.final.accuracy == pytest.approx(_scored_with(c, clients, models), abs=1e-9)
    assert ditto.final.accuracy != fedavg.final.accuracy


def test_fedavg_ft_trains_as_fedavg_and_scores_each_client_after_it_fine_tunes(
        clients, fedavg_run):
    """FedAvg+FT is FedAvg's run (the same shared model and bytes, nothing kept); each
    client is scored after 5 epochs of the whole model on its own training data, from the
    round's model, in the batch order of the round's fine-tuning stream (seed words
    (seed, attempt, round, 2)): recomputed here one client at a time."""
    c = config(method="fedavg-ft", pretraining="none", rounds=3, participation=1 / 3,
               batch_size=8)
    tuned_run, state = run_federated(resolve(c), clients, context=RunContext(verbose=0))
    fedavg, fedavg_state = fedavg_run
    assert all(np.array_equal(a, b) for a, b in zip(state.models[0], fedavg_state.models[0]))
    assert tuned_run.final.bytes_up == fedavg.final.bytes_up and tuned_run.final.bytes_kept == 0
    from cpcfl_tf.clustered.pool import template_for

    fl = resolve(c).federated
    assert fl.options == {"finetune_epochs": 5}
    template = template_for(resolve(c), clients.train.images.shape[2:], clients.num_classes)
    n, size = clients.train.num_clients, clients.train.size
    orders = batch_orders(n, size, 5, [c.seed, 0, 3, 2])
    one = StackedBackend(template)  # one client at a time: the bits of the clients together
    models = [[a[0] for a in one.train(stack_models([state.models[0]]), np.zeros(1, np.int64),
                                       clients.train.subset(np.array([u])), orders[:, u:u + 1],
                                       ["model"] * 5, LocalTraining.of(fl))]
              for u in range(n)]
    assert tuned_run.final.accuracy == pytest.approx(_scored_with(c, clients, models), abs=1e-9)
    assert tuned_run.final.accuracy > fedavg.final.accuracy
    # the scores read the fine-tuned models' probabilities, to the bit
    from cpcfl_tf.clustered.backends import client_probabilities
    from cpcfl_tf.clustered.metrics import pooled_scores

    probs = client_probabilities(one, models, np.arange(n), clients.test)
    assert tuned_run.final.scores == pooled_scores(clients.test.labels, probs)
