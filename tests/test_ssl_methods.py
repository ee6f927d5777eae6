"""The pre-training stage's registry (cpcfl_tf/methods/ssl.py): VICReg through it alone,
per-method settings that keep every key and record, the kNN monitor and the schedules."""
import dataclasses
import json

import numpy as np
import pytest

from cpcfl_tf import compat
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.sections import PretrainConfig
from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.ssl import SSL_METHODS, Setting, check_options

from helpers import ROOT


# -- VICReg's loss, against the paper's equations in NumPy -------------------------------

def _vicreg_numpy(z1, z2, lam=25.0, mu=25.0, nu=1.0, gamma=1.0, eps=1e-4):
    """VICReg (Bardes et al., ICLR 2022) written from its equations, term by term:
    v (Eq. 1, with S of Eq. 2), c (Eq. 3-4), s (Eq. 5), combined as Eq. 6 with the two
    normalisations of the authors' code the kit follows (docs/choices.md): s averaged
    over the d dimensions too, the two branches' v averaged."""
    z1, z2 = z1.astype(np.float64), z2.astype(np.float64)
    n, d = z1.shape

    def v(z):
        std = np.sqrt(z.var(axis=0, ddof=1) + eps)
        return np.mean(np.maximum(0.0, gamma - std))

    def c(z):
        centred = z - z.mean(axis=0)
        cov = centred.T @ centred / (n - 1)
        return sum(cov[i, j] ** 2 for i in range(d) for j in range(d) if i != j) / d

    s = np.mean(np.sum((z1 - z2) ** 2, axis=1)) / d
    return lam * s + mu * (v(z1) + v(z2)) / 2 + nu * (c(z1) + c(z2))


@pytest.mark.parametrize("scale", [0.05, 3.0])  # variance term active / inactive
def test_vicreg_loss_equals_the_numpy_equations(scale):
    from cpcfl_tf.pretraining.vicreg import vicreg_loss

    rng = np.random.default_rng(0)
    z1 = rng.normal(0, scale, (16, 12)).astype(np.float32)
    z2 = (z1 + rng.normal(0, 0.3, z1.shape)).astype(np.float32)
    want = _vicreg_numpy(z1, z2)
    assert float(vicreg_loss(z1, z2)) == pytest.approx(want, rel=1e-5)
    weights = dict(sim_weight=1.0, var_weight=2.0, cov_weight=0.5, gamma=2.0, epsilon=1e-3)
    assert float(vicreg_loss(z1, z2, **weights)) == pytest.approx(
        _vicreg_numpy(z1, z2, 1.0, 2.0, 0.5, 2.0, 1e-3), rel=1e-5)
    # each term alone (the others weighted 0) is its equation's
    for weights in ({"var_weight": 0, "cov_weight": 0}, {"sim_weight": 0, "cov_weight": 0},
                    {"sim_weight": 0, "var_weight": 0}):
        lam, mu, nu = (weights.get(k, w) for k, w in (("sim_weight", 25.0),
                                                      ("var_weight", 25.0), ("cov_weight", 1.0)))
        assert float(vicreg_loss(z1, z2, **weights)) == pytest.approx(
            _vicreg_numpy(z1, z2, lam, mu, nu), rel=1e-5, abs=1e-7)


def test_vicreg_is_built_from_its_registry_entry_with_an_expander_scaled_to_the_encoder():
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model

    model = build_contrastive_model(PretrainConfig(), (32, 32, 3), method=SSL_METHODS["vicreg"])
    assert [layer.units for layer in model.projector.layers if hasattr(layer, "units")] == \
        [1024, 1024, 1024]  # 4 x the CNN's 256
    narrow = PretrainConfig().with_settings("vicreg", projector_dim=512, cov_weight=0.5)
    model = build_contrastive_model(narrow, (32, 32, 3), method=SSL_METHODS["vicreg"])
    assert model.projector.output_shape == (None, 512)
    assert model.loss_settings["cov_weight"] == 0.5 and model.loss_settings["sim_weight"] == 25


def test_the_pretraining_stage_builds_the_method_the_plan_hands_it(monkeypatch):
    """A run's plan carries its self-supervised method's entry: the pre-training stage
    builds that entry, never the registry's under the same name (the registry changed
    after the plan was made does not reach the model), and with the plan's settings."""
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.plan.resolve import pretraining_of
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model

    config = get_preset("smoke").with_overrides(federated={"pretraining": "vicreg"})
    config = dataclasses.replace(config, pretrain=config.pretrain.with_settings(
        "vicreg", projector_dim=96))
    pretraining = pretraining_of(config)
    assert pretraining.ssl is SSL_METHODS["vicreg"] and pretraining.method == "vicreg"
    assert pretraining.settings["projector_dim"] == 96 and pretraining.seed == 0
    monkeypatch.delitem(SSL_METHODS, "vicreg")  # no name can be looked up now
    model = build_contrastive_model(pretraining.pretrain, (32, 32, 3), method=pretraining.ssl)
    assert model.projector.output_shape == (None, 96)


def test_vicregs_loss_is_the_one_its_settings_say_with_every_weight_passed_through():
    """Built with gamma and epsilon away from their defaults, the model's loss settings
    give the NumPy equations' value with those settings (a build that dropped them would
    fall back to the loss function's own defaults)."""
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model
    from cpcfl_tf.pretraining.vicreg import vicreg_loss

    config = PretrainConfig().with_settings("vicreg", sim_weight=5.0, var_weight=7.0,
                                            cov_weight=0.5, gamma=2.0, epsilon=1e-2)
    model = build_contrastive_model(config, (32, 32, 3), method=SSL_METHODS["vicreg"])
    rng = np.random.default_rng(1)
    z1 = rng.normal(0, 0.5, (16, 12)).astype(np.float32)
    z2 = (z1 + rng.normal(0, 0.3, z1.shape)).astype(np.float32)
    assert float(vicreg_loss(z1, z2, **model.loss_settings)) == pytest.approx(
        _vicreg_numpy(z1, z2, 5.0, 7.0, 0.5, 2.0, 1e-2), rel=1e-5)


PAPER_DEFAULTS = {
    # SimCLR and BYOL/SimSiam as the CP-CFL paper sets them (Sec. "Experimental settings":
    # NT-Xent temperature 0.1, BYOL's target decay 0.9, the predictor's 64 units; the
    # projector's width per encoder, None here) and BYOL's constant beta.
    "simclr": {"temperature": 0.1, "projector_dim": None},
    "byol": {"target_decay": 0.9, "target_schedule": "constant", "projector_dim": None,
             "predictor_dim": 64},
    "simsiam": {"projector_dim": None, "predictor_dim": 64},
    # VICReg, Sec. 4.3: lambda = mu = 25, nu = 1; Eq. 1: gamma = 1, epsilon = 1e-4.
    "vicreg": {"sim_weight": 25.0, "var_weight": 25.0, "cov_weight": 1.0, "gamma": 1.0,
               "epsilon": 1e-4, "projector_dim": None},
}


@pytest.mark.parametrize("method", sorted(PAPER_DEFAULTS))
def test_the_registry_defaults_are_the_methods_papers(method):
    assert PretrainConfig().settings(method) == PAPER_DEFAULTS[method]


def test_every_setting_of_a_keyed_method_is_assumed_by_its_keys():
    """The settings the cache keys leave out at their value (compat.KEYED_DEFAULTS, and
    ADDED_SETTINGS for those added later): every setting of the methods listed there,
    so a new setting must be declared with the value that runs as before."""
    for method, assumed in compat.KEYED_DEFAULTS.items():
        declared = {**assumed, **compat.ADDED_SETTINGS.get(method, {})}
        missing = set(SSL_METHODS[method].settings) - set(declared)
        assert not missing, (f"{method}'s settings {sorted(missing)} are not in "
                             "compat.KEYED_DEFAULTS or compat.ADDED_SETTINGS: add each with "
                             "the value that runs as before")


def test_a_changed_registry_default_changes_that_methods_keys_only(monkeypatch):
    """VICReg's covariance weight moved from 1 to 2 in the registry: every VICReg key of
    the committed records changes (a cached encoder of weight 1 is not taken for 2), the
    other methods' keys stay; an explicit 1.0 is the old key again."""
    from cpcfl_tf.pretraining.pretrain import image_source, pretrain_key

    found = _encoders_named_by_committed_records()

    def keys():
        return [(m, pretrain_key(c.pretrain, m, data=image_source(c.data), seed=c.pretrain_seed))
                for c, m in found]

    before = keys()
    plain = pretrain_key(PretrainConfig(), "vicreg", seed=0)
    entry = SSL_METHODS["vicreg"]
    monkeypatch.setitem(SSL_METHODS, "vicreg", dataclasses.replace(entry, settings={
        **entry.settings, "cov_weight": dataclasses.replace(entry.settings["cov_weight"],
                                                            default=2.0)}))
    after = keys()
    assert any(m == "vicreg" for m, _ in before)
    for (config, method), (_, old), (_, new) in zip(found, before, after):
        explicit = "cov_weight" in ((config.pretrain.options or {}).get(method) or {})
        assert (old != new) == (method == "vicreg" and not explicit), method
    assert pretrain_key(PretrainConfig(), "vicreg", seed=0) != plain
    assert pretrain_key(PretrainConfig().with_settings("vicreg", cov_weight=1.0), "vicreg",
                        seed=0) == plain


# -- settings in one mapping, keys and records unchanged --------------------------------

def test_options_are_checked_and_kept_without_their_defaults():
    assert check_options({"simclr": {"temperature": 0.1}, "byol": {}}) is None
    assert check_options({"byol": {"target_decay": 0.99, "predictor_dim": 64}}) == \
        {"byol": {"target_decay": 0.99}}
    with pytest.raises(UserError, match="simsiam has no setting 'temperature'.*settings: "):
        check_options({"simsiam": {"temperature": 0.2}})
    with pytest.raises(UserError, match="vicreg.sim_weight must be a number >= 0"):
        check_options({"vicreg": {"sim_weight": -1}})
    assert PretrainConfig().settings("byol")["target_decay"] == 0.9


@pytest.mark.parametrize("options", [
    None, {"simclr": {"temperature": 0.2}}, {"byol": {"projector_dim": 1024}},
    {"simclr": {"projector_dim": 512}, "byol": {"projector_dim": 1024, "target_decay": 0.99}},
    {"vicreg": {"cov_weight": 0.5}}, {"byol": {"target_schedule": "cosine"}}])
@pytest.mark.parametrize("start", ["simclr", "byol", "vicreg", "none"])
def test_the_stored_layout_reads_back_as_the_same_config(options, start):
    config = get_preset("smoke").with_overrides(pretrain={"options": options},
                                                federated={"method": "ifca", "pretraining": start})
    stored = json.loads(json.dumps(config.to_dict()))
    assert list(stored["pretrain"])[:8] == ["encoder", "epochs", "batch_size", "learning_rate",
                                            "temperature", "target_decay", "projector_dim",
                                            "predictor_dim"]
    assert Config.from_dict(stored) == config
    record = config.to_dict()["pretrain"]
    if start in SSL_METHODS:  # the record names every setting of the run's method
        shown = {k: record[k] for k in compat.LEGACY_PRETRAIN if start in
                 compat.LEGACY_PRETRAIN[k][1]} | (record.get("options") or {}).get(start, {})
        added = compat.ADDED_SETTINGS.get(start, {})
        assert {k: v for k, v in config.pretrain.settings(start).items()
                if k not in added or v != added[k]} == shown


def test_an_older_record_layout_with_flat_settings_reads_as_options():
    stored = get_preset("quick").to_dict()
    stored["pretrain"].update(temperature=0.5, projector_dim=512)
    stored["pretrain"].pop("options", None)
    pre = Config.from_dict(stored).pretrain
    assert pre.options == {"byol": {"projector_dim": 512}, "simclr": {"projector_dim": 512,
                                                                       "temperature": 0.5},
                           "simsiam": {"projector_dim": 512}}


def _encoders_named_by_committed_records():
    """(pretrain section as stored, method, data, seed) of every committed run record
    that starts from the server's self-supervised pre-training, once each."""
    from cpcfl_tf.pretraining.pretrain import image_source

    seen = {}
    for path in sorted((ROOT / "results").rglob("*.json")):
        record = json.loads(path.read_text())
        if not {"rounds", "final", "config"} <= set(record):
            continue
        if record["pretraining"] not in SSL_METHODS:
            continue
        config = Config.from_dict({k: v for k, v in record["config"].items()
                                   if k != "requested"})
        key = json.dumps([config.to_dict()["pretrain"], record["pretraining"],
                          image_source(config.data), config.pretrain_seed], sort_keys=True)
        seen[key] = (config, record["pretraining"])
    return list(seen.values())


def test_a_new_pretrain_field_or_setting_at_its_default_keeps_every_committed_key(monkeypatch):
    """A field added to the pre-training config (here a test-local subclass) and a setting
    added to a method, both at the value that runs as before, change no cache key of any
    encoder the committed records start from, nor their records."""
    from cpcfl_tf.pretraining.pretrain import image_source, pretrain_key

    found = _encoders_named_by_committed_records()
    assert len(found) >= 20 and {m for _, m in found} >= {"simclr", "byol", "simsiam", "vicreg"}

    def keys():
        return [pretrain_key(c.pretrain, m, data=image_source(c.data), seed=c.pretrain_seed)
                for c, m in found]

    before = keys()
    Extended = dataclasses.make_dataclass("Extended", [("momentum", float, 0.0)],
                                          bases=(PretrainConfig,), frozen=True)
    monkeypatch.setitem(compat.ADDED_FIELDS, "pretrain",
                        {**compat.ADDED_FIELDS["pretrain"], "momentum": 0.0})
    found = [(dataclasses.replace(c, pretrain=Extended(**dataclasses.asdict(c.pretrain))), m)
             for c, m in found]
    entry = SSL_METHODS["simclr"]
    monkeypatch.setitem(SSL_METHODS, "simclr", dataclasses.replace(
        entry, settings={**entry.settings, "negatives_weight": Setting(1.0, "test")}))
    monkeypatch.setitem(compat.ADDED_SETTINGS, "simclr", {"negatives_weight": 1.0})
    assert keys() == before
    # set away from its default, the new field does change the key
    moved = dataclasses.replace(found[0][0].pretrain, momentum=0.5)
    assert pretrain_key(moved, found[0][1], data=image_source(found[0][0].data),
                        seed=0) != pretrain_key(found[0][0].pretrain, found[0][1],
                                                data=image_source(found[0][0].data), seed=0)


def test_a_method_setting_left_out_of_compat_would_change_the_records(monkeypatch):
    """The guard the previous test relies on: without its ADDED_SETTINGS entry, a setting
    added to SimCLR would appear in every SimCLR record (so the committed ones would no
    longer be what the code writes)."""
    config = get_preset("quick")
    assert "options" not in config.to_dict()["pretrain"]
    entry = SSL_METHODS["simclr"]
    monkeypatch.setitem(SSL_METHODS, "simclr", dataclasses.replace(
        entry, settings={**entry.settings, "negatives_weight": Setting(1.0, "test")}))
    assert config.to_dict()["pretrain"]["options"] == {"simclr": {"negatives_weight": 1.0}}


# -- the schedules ----------------------------------------------------------------------

def test_the_cosine_schedule_warms_up_linearly_then_decays_to_zero():
    from cpcfl_tf.pretraining.pretrain import learning_rate

    assert learning_rate(PretrainConfig(epochs=10), 7) == 1e-3  # the paper's constant rate
    schedule = learning_rate(PretrainConfig(epochs=10, lr_schedule="cosine", warmup_epochs=2),
                             5)
    rates = [float(schedule(step)) for step in (0, 5, 10, 35, 50)]
    assert rates[0] == 0 and rates[1] == pytest.approx(5e-4) and rates[2] == pytest.approx(1e-3)
    assert rates[3] == pytest.approx(1e-3 * (1 + np.cos(np.pi * 25 / 40)) / 2, rel=1e-5)
    assert rates[4] == pytest.approx(0, abs=1e-9)
    plain = learning_rate(PretrainConfig(epochs=10, lr_schedule="cosine"), 5)
    assert float(plain(0)) == pytest.approx(1e-3) and float(plain(25)) == pytest.approx(5e-4)


def test_byols_target_rate_follows_its_cosine_schedule(digits_images):
    import tensorflow as tf

    from cpcfl_tf.pretraining.byol import cosine_target_rate
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model

    rates = [float(cosine_target_rate(0.9, k, 100)) for k in (0, 50, 100)]
    assert rates == pytest.approx([0.9, 0.95, 1.0])
    config = PretrainConfig(epochs=4).with_settings("byol", target_schedule="cosine")
    model = build_contrastive_model(config, (32, 32, 3), method=SSL_METHODS["byol"], steps_per_epoch=1)
    assert model.total_steps == 4
    target, online = model.target_encoder.trainable_variables, model.encoder.trainable_variables
    for step in range(2):
        before = [v.numpy().copy() for v in target]
        model.train_step(tf.constant(digits_images[:32]))
        beta = float(cosine_target_rate(0.9, step, 4))
        for b, t, o in zip(before, target, online):
            np.testing.assert_allclose(t.numpy(), beta * b + (1 - beta) * o.numpy(), atol=1e-6)


def test_a_pretraining_sizes_its_schedules_by_its_steps(tmp_path, monkeypatch):
    """pretrain() on 64 images, batch 16, 2 epochs: 4 steps an epoch, 8 in all. The cosine
    learning rate is half the base rate after step 4 of 8 and the last step's BYOL target
    rate is 1 - 0.1 (cos(7 pi / 8) + 1) / 2 (hand-worked from BYOL Sec. 3.2); schedules
    sized by epochs alone (2 steps) would have reached 0 and 1 long before."""
    from cpcfl_tf.pretraining import pretrain as module

    built = []
    real = module.build_contrastive_model

    def spy(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(module, "build_contrastive_model", spy)
    config = PretrainConfig(epochs=2, batch_size=16, lr_schedule="cosine").with_settings(
        "byol", target_schedule="cosine")
    images = np.random.default_rng(0).integers(0, 255, (64, 32, 32, 3), dtype=np.uint8)
    module.pretrain(config, images, tmp_path / "pre", method=SSL_METHODS["byol"], verbose=0)
    (model,) = built
    assert int(model.optimizer.iterations) == 8 and model.total_steps == 8
    schedule = model.optimizer._learning_rate
    assert float(schedule(4)) == pytest.approx(0.5e-3, rel=1e-5)
    assert float(schedule(2)) == pytest.approx(1e-3 * (1 + np.cos(np.pi / 4)) / 2, rel=1e-5)
    assert float(model.target_rate()) == pytest.approx(
        1 - 0.1 * (np.cos(7 * np.pi / 8) + 1) / 2, rel=1e-6)


# -- the kNN monitor --------------------------------------------------------------------

def test_weighted_knn_equals_a_brute_force_vote():
    from cpcfl_tf.pretraining.knn import knn_predict

    rng = np.random.default_rng(1)
    bank, labels = rng.normal(size=(60, 5)), rng.integers(0, 3, 60)
    queries = rng.normal(size=(9, 5))
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    want = []
    for q in unit(queries):
        sims = unit(bank) @ q
        top = np.argsort(-sims)[:7]
        votes = np.zeros(3)
        np.add.at(votes, labels[top], np.exp(sims[top] / 0.07))
        want.append(int(np.argmax(votes)))
    assert knn_predict(bank, labels, queries, 3, k=7, chunk=4).tolist() == want


def test_the_monitor_records_knn_accuracy_and_leaves_the_encoders_bits(digits_images, tmp_path):
    from cpcfl_tf.pretraining.knn import KnnMonitor
    from cpcfl_tf.pretraining.pretrain import pretrain
    from cpcfl_tf.data.sources import load_labeled

    train = load_labeled("digits", "train[697:1000]", image_size=32)
    test = load_labeled("digits", "test[:200]", image_size=32)
    config = PretrainConfig(epochs=3, batch_size=64)
    images = digits_images[:128]
    plain = pretrain(config, images, tmp_path / "plain", verbose=0, method=SSL_METHODS["simclr"])
    watched = pretrain(config, images, tmp_path / "watched", verbose=0,
                       monitor=KnnMonitor(train, test, every=2), method=SSL_METHODS["simclr"])
    assert [("knn_accuracy" in h) for h in watched.history] == [False, True, True]
    assert all(0 <= h["knn_accuracy"] <= 1 for h in watched.history[1:])
    for a, b in zip(plain.encoder.get_weights(), watched.encoder.get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(UserError, match="has no labels.*--knn-proxy"):
        KnnMonitor(dataclasses.replace(train, labels=None), test)


@pytest.fixture(scope="module")
def digits_images():
    from cpcfl_tf.data import load_unlabeled

    return load_unlabeled("digits", "train[:697]", image_size=32)


@pytest.mark.parametrize("method", list(SSL_METHODS))
def test_what_a_default_width_stands_for_is_what_the_method_builds(method):
    """The registry's ``means`` (how the encoder selection spells a grid value equal to
    the default, so it finds the cached encoder) agrees with the method's ``build``
    (built here on a small stand-in encoder of the CNN's width)."""
    import keras

    from cpcfl_tf.pretraining.model import Parts

    def encoder(name="encoder"):
        inputs = keras.Input((4, 4, 3))
        return keras.Model(inputs, keras.layers.Dense(256)(keras.layers.Flatten()(inputs)),
                           name=name)

    spec = SSL_METHODS[method]
    width = spec.settings["projector_dim"].means("cnn", 256)
    models = [spec.build(Parts(encoder(), None, "cnn", 256, encoder), spec.resolve(given))
              for given in (None, {"projector_dim": width})]
    shapes = [[tuple(w.shape) for w in m.projector.weights] for m in models]
    assert shapes[0] == shapes[1] and models[0].projector.output_shape[-1] == width
    assert spec.spelled("projector_dim", width, "cnn", 256) is None
