import keras
import numpy as np
import pytest

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.pretraining.linear_eval import encode, relevance_score
from cpcfl_tf.data import load_labeled
from cpcfl_tf.clustered.clients import clients_for
from cpcfl_tf.clustered.centralized import centralized_baseline, supervised_encoder
from cpcfl_tf.models import build_encoder
from cpcfl_tf.plan.resolve import resolve

SMOKE = get_preset("smoke").with_overrides(federated={"centralized_epochs": 3})


@pytest.fixture(scope="module")
def clients():
    return clients_for(SMOKE)


@pytest.mark.parametrize("by_group", [False, True])
def test_centralized_baselines_score_every_client(clients, by_group):
    result = centralized_baseline(resolve(SMOKE), clients, by_group=by_group)
    assert 0.0 <= result["accuracy"] <= 1.0 and result["epochs"] == 3
    assert "f1_macro" in result and "auroc_ovo_weighted" in result
    assert centralized_baseline(resolve(SMOKE), clients, by_group=by_group) == result  # seeded


def test_default_centralized_epochs_are_a_clients_passes(clients):
    c = get_preset("smoke").with_overrides(federated={"rounds": 2})
    assert c.federated.centralized_epochs is None and c.federated.local_epochs == 1
    default = centralized_baseline(resolve(c), clients, by_group=False)
    assert default["epochs"] == 2
    assert default == centralized_baseline(resolve(c.with_overrides(
        federated={"centralized_epochs": 2})), clients, by_group=False)
    assert default != centralized_baseline(resolve(c.with_overrides(
        federated={"centralized_epochs": 1})), clients, by_group=False)


def test_the_by_group_baseline_trains_one_model_per_group_on_its_data_alone(clients,
                                                                            monkeypatch):
    import cpcfl_tf.clustered.centralized as centralized

    seen = {}
    train, score = centralized._train_pooled, centralized.client_probabilities

    def pooled(config, data, *args):
        seen["data"] = data
        return train(config, data, *args)

    def probabilities(backend, models, ids, test):
        seen["models"], seen["ids"] = models, ids
        return score(backend, models, ids, test)

    monkeypatch.setattr(centralized, "_train_pooled", pooled)
    monkeypatch.setattr(centralized, "client_probabilities", probabilities)
    centralized_baseline(resolve(SMOKE), clients, by_group=True)
    assert len(seen["models"]) == 3 and seen["ids"].tolist() == clients.groups.tolist()
    for g in range(3):  # row g pools exactly group g's training images
        own = clients.train.images[clients.groups == g]
        np.testing.assert_array_equal(seen["data"].images[g], own.reshape(-1, *own.shape[2:]))
    assert not np.array_equal(seen["models"][0][-1], seen["models"][1][-1])


def test_supervised_encoder_learns_from_labels():
    labeled = load_labeled("digits", "train[:256]", image_size=32)
    weights = supervised_encoder(resolve(SMOKE), labeled, epochs=2)
    keras.utils.set_random_seed(0)
    fresh = build_encoder("cnn", (32, 32, 3))
    assert [w.shape for w in weights] == [w.shape for w in fresh.get_weights()]
    fresh.set_weights(weights)
    assert np.isfinite(encode(fresh, labeled.images[:8])).all()


def test_relevance_score_is_the_mean_cross_cosine():
    a = load_labeled("digits", "test", image_size=32).images
    b = load_labeled("fashion_mnist_idx", "test[:500]", image_size=32).images
    keras.utils.set_random_seed(0)
    encoder = build_encoder("cnn", (32, 32, 3))
    score = relevance_score(encoder, a, b, count=50, seed=3)
    rng = np.random.default_rng(3)
    fa = encode(encoder, a[rng.choice(len(a), 50, replace=False)])
    fb = encode(encoder, b[rng.choice(len(b), 50, replace=False)])
    fa /= np.linalg.norm(fa, axis=1, keepdims=True)
    fb /= np.linalg.norm(fb, axis=1, keepdims=True)
    assert score == pytest.approx(float((fa @ fb.T).mean()), rel=1e-5)
    assert -1.0 <= score <= 1.0
