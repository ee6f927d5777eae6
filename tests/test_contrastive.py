import numpy as np
import pytest
import tensorflow as tf

from cpcfl_tf.plan.sections import PretrainConfig
from cpcfl_tf.pretraining.byol import symmetric_byol
from cpcfl_tf.pretraining.losses import byol_loss, embedding_std, nt_xent, simsiam_loss
from cpcfl_tf.pretraining.model import predicted
from cpcfl_tf.pretraining.simsiam import symmetric_simsiam
from cpcfl_tf.pretraining.pretrain import DivergedError, build_contrastive_model, pretrain
from cpcfl_tf.data import load_unlabeled
from cpcfl_tf.data.augment import build_augmenter
from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.ssl import SSL_METHODS

RNG = np.random.default_rng(0)


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def numpy_nt_xent(zi, zj, tau):
    z = unit(np.concatenate([zi, zj]))
    n = len(zi)
    losses = []
    for a in range(2 * n):
        positive = (a + n) % (2 * n)
        sims = z @ z[a] / tau
        others = [sims[k] for k in range(2 * n) if k != a]
        losses.append(-(sims[positive] - np.log(np.sum(np.exp(others)))))
    return np.mean(losses)


@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_nt_xent_matches_numpy(tau):
    zi, zj = RNG.normal(size=(6, 8)), RNG.normal(size=(6, 8))
    assert np.isclose(float(nt_xent(tf.constant(zi), tf.constant(zj), tau)),
                      numpy_nt_xent(zi, zj, tau), rtol=1e-6)


def test_byol_and_simsiam_losses_match_numpy():
    p, z = RNG.normal(size=(5, 7)), RNG.normal(size=(5, 7))
    cos = np.sum(unit(p) * unit(z), axis=1)
    assert np.isclose(float(byol_loss(tf.constant(p), tf.constant(z))), np.mean(2 - 2 * cos))
    assert np.isclose(float(byol_loss(tf.constant(p), tf.constant(z))),
                      np.mean(np.sum((unit(p) - unit(z)) ** 2, axis=1)))
    assert np.isclose(float(simsiam_loss(tf.constant(p), tf.constant(z))), -np.mean(cos))


def test_collapse_monitor():
    spread = tf.constant(RNG.normal(size=(512, 64)), tf.float32)
    assert abs(float(embedding_std(spread)) - 1 / 8) < 0.01
    collapsed = tf.ones((512, 64))
    assert float(embedding_std(collapsed)) < 1e-6


@pytest.mark.parametrize("loss", [symmetric_byol, symmetric_simsiam])
def test_no_gradient_reaches_the_stopped_branch(loss):
    p1, p2, z1, z2 = (tf.Variable(RNG.normal(size=(4, 6)), dtype=tf.float32) for _ in range(4))
    with tf.GradientTape(persistent=True) as tape:
        value = loss(p1, p2, z1, z2)
    assert tape.gradient(value, z1) is None and tape.gradient(value, z2) is None
    assert tape.gradient(value, p1) is not None


def test_augmenter_is_seeded_in_range_and_keeps_gray_gray():
    gray = tf.repeat(tf.random.stateless_uniform((16, 32, 32, 1), (1, 2)), 3, axis=-1)
    first = build_augmenter(seed=5)(gray, training=True).numpy()
    again = build_augmenter(seed=5)(gray, training=True).numpy()
    other = build_augmenter(seed=6)(gray, training=True).numpy()
    assert np.array_equal(first, again) and not np.allclose(first, other)
    assert first.min() >= 0.0 and first.max() <= 1.0 and first.shape == (16, 32, 32, 3)
    assert np.allclose(first[..., 0], first[..., 1], atol=1e-5)
    augmenter = build_augmenter(seed=5)
    assert not np.allclose(augmenter(gray, training=True), augmenter(gray, training=True))
    assert np.array_equal(augmenter(gray, training=False), gray)
    with pytest.raises(UserError, match="unknown augmentation"):
        build_augmenter({"blur": 1})


def test_brightness_is_on_the_unit_scale():
    flat = tf.fill((64, 32, 32, 3), 0.5)
    out = build_augmenter({"crop_scale": (1.0, 1.0), "contrast": 0.0, "saturation": 0.0, "hue": 0.0,
                           "jitter_probability": 1.0, "grayscale_probability": 0.0,
                           "brightness": 0.4}, seed=0)(flat, training=True).numpy()
    shifts = out.mean(axis=(1, 2, 3)) - 0.5
    assert np.abs(shifts).max() <= 0.4 + 1e-5 and np.abs(shifts).max() > 0.2


@pytest.fixture(scope="module")
def digits():
    return load_unlabeled("digits", "train[:256]", image_size=32)


def _weights(model):
    return [w.copy() for w in model.get_weights()]


@pytest.mark.parametrize("method", list(SSL_METHODS))
def test_one_step_changes_the_online_weights(method, digits):
    model = build_contrastive_model(PretrainConfig(batch_size=64), (32, 32, 3), method=SSL_METHODS[method])
    before = _weights(model.encoder)
    logs = model.train_step(tf.constant(digits[:64]))
    assert set(logs) == {"loss", "embedding_std"} and np.isfinite(float(logs["loss"]))
    assert any(not np.allclose(a, b) for a, b in zip(before, model.encoder.get_weights()))


def _np_cos(a, b):
    return np.sum(unit(a) * unit(b), axis=1)


@pytest.mark.parametrize("method", ["byol", "simsiam"])
def test_each_view_predicts_the_other_views_target(method, digits):
    """The symmetrised losses pair p1 with the (stopped) target of view 2 and p2 with that
    of view 1 (BYOL: 2 - 2 cos, summed; SimSiam: -cos, halved), checked in NumPy on the
    model's own branches; the same-view pairing gives another value."""
    model = build_contrastive_model(PretrainConfig(), (32, 32, 3), method=SSL_METHODS[method])
    view1, view2 = model.views(tf.constant(digits[:32]))
    loss, _ = model.contrastive_loss(view1, view2)
    (p1, z1), (p2, z2) = (tuple(t.numpy().astype(np.float64)
                                for t in predicted(model, v)) for v in (view1, view2))
    if method == "byol":
        t1, t2 = (model._target(v).numpy().astype(np.float64) for v in (view1, view2))
        want = np.mean(2 - 2 * _np_cos(p1, t2)) + np.mean(2 - 2 * _np_cos(p2, t1))
        same = np.mean(2 - 2 * _np_cos(p1, t1)) + np.mean(2 - 2 * _np_cos(p2, t2))
    else:
        want = 0.5 * (-np.mean(_np_cos(p1, z2)) - np.mean(_np_cos(p2, z1)))
        same = 0.5 * (-np.mean(_np_cos(p1, z1)) - np.mean(_np_cos(p2, z2)))
    assert float(loss) == pytest.approx(want, abs=1e-5)
    assert abs(same - want) > 1e-3


def test_byol_target_is_the_moving_average_and_gets_no_gradient(digits):
    model = build_contrastive_model(PretrainConfig(), (32, 32, 3),
                                    method=SSL_METHODS["byol"])
    targets = model.target_encoder.trainable_variables + model.target_projector.trainable_variables
    view1, view2 = model.views(tf.constant(digits[:32]))
    with tf.GradientTape() as tape:
        loss, _ = model.contrastive_loss(view1, view2)
    assert all(g is None for g in tape.gradient(loss, targets))

    before = [v.numpy().copy() for v in targets]
    model.train_step(tf.constant(digits[:32]))
    online = model.encoder.trainable_variables + model.projector.trainable_variables
    for t_before, t_after, o in zip(before, targets, online):
        assert np.allclose(t_after.numpy(), 0.9 * t_before + 0.1 * o.numpy(), atol=1e-6)
    slots = {tuple(v.shape) for v in model.optimizer.variables if len(v.shape)}
    assert slots == {tuple(v.shape) for v in model.online_variables}


def test_pretrain_saves_the_encoder_alone_and_reuses_it(digits, tmp_path):
    config = PretrainConfig(epochs=2, batch_size=64)
    result = pretrain(config, digits, tmp_path, seed=1, verbose=0, method=SSL_METHODS["simclr"])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["encoder.keras", "encoder.weights.h5", "pretrain.json"]
    assert [h["epoch"] for h in result.history] == [1, 2]
    again = pretrain(config, digits, tmp_path, seed=1, verbose=0, method=SSL_METHODS["simclr"])
    assert all(np.array_equal(a, b) for a, b in zip(result.encoder.get_weights(),
                                                    again.encoder.get_weights()))
    with pytest.raises(UserError, match="different finished pre-training"):
        pretrain(config, digits, tmp_path, seed=2, verbose=0, method=SSL_METHODS["simclr"])


def test_pretrained_encoder_pretrains_the_method_a_run_names(tmp_path, monkeypatch):
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.pretraining import pretrain as module

    calls = []
    monkeypatch.setattr(module, "pretrain", lambda config, images, out, method, **_: calls.append(
        (config, method, out)))
    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path))
    config = get_preset("smoke")
    images = np.zeros((2, 8, 8, 3), np.float32)
    for method in ("byol", "simsiam"):
        module.pretrained_encoder(config.pretrain, config.data, method=SSL_METHODS[method], images=images,
                                  verbose=0)
    (byol, byol_method, byol_dir), (simsiam, simsiam_method, simsiam_dir) = calls
    assert byol == simsiam == config.pretrain
    assert (byol_method.name, simsiam_method.name) == ("byol", "simsiam")
    assert byol_dir != simsiam_dir  # each method has its own cache entry
    assert byol_dir.name.startswith("byol-") and simsiam_dir.name.startswith("simsiam-")


def test_an_interrupted_pretraining_resumes_to_the_same_encoder(digits, tmp_path, monkeypatch):
    config = PretrainConfig(epochs=3, batch_size=64)
    whole = pretrain(config, digits, tmp_path / "whole", method=SSL_METHODS["byol"], seed=0, verbose=0)

    from cpcfl_tf.pretraining import pretrain as driver
    real_save = driver._save_checkpoint

    def save_then_die(path, model, epoch, meta, history):
        real_save(path, model, epoch, meta, history)
        if epoch == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(driver, "_save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        pretrain(config, digits, tmp_path / "cut", method=SSL_METHODS["byol"], seed=0, verbose=0)
    assert (tmp_path / "cut" / "checkpoint.npz").exists()
    monkeypatch.setattr(driver, "_save_checkpoint", real_save)
    resumed = pretrain(config, digits, tmp_path / "cut", method=SSL_METHODS["byol"], seed=0, verbose=0)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    for a, b in zip(whole.encoder.get_weights(), resumed.encoder.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_damaged_checkpoint_starts_the_pre_training_over(digits, tmp_path, capsys):
    config = PretrainConfig(epochs=1, batch_size=64)
    whole = pretrain(config, digits, tmp_path / "whole", seed=0, verbose=0, method=SSL_METHODS["simclr"])
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "checkpoint.npz").write_bytes(b"not a checkpoint")
    again = pretrain(config, digits, tmp_path / "cut", seed=0, verbose=0, method=SSL_METHODS["simclr"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint.npz is damaged" in err[0] and "over" in err[0]
    for a, b in zip(whole.encoder.get_weights(), again.encoder.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_nan_loss_stops_with_a_clear_error(digits, tmp_path, monkeypatch):
    from cpcfl_tf.pretraining import simclr

    monkeypatch.setattr(simclr, "nt_xent_across_replicas",
                        lambda zi, zj, tau: tf.reduce_sum(zi) * float("nan"))
    with pytest.raises(DivergedError, match=r"loss became nan .*pretrain\.learning_rate"):
        pretrain(PretrainConfig(epochs=2, batch_size=64), digits, tmp_path, verbose=0, method=SSL_METHODS["simclr"])
    assert not (tmp_path / "encoder.keras").exists()


def _two_step_losses(config, method, views, jit_compile=False):
    """The losses of two steps on the same views, from the seeded initial weights."""
    model = build_contrastive_model(config, (32, 32, 3), method=SSL_METHODS[method], seed=3)
    update = tf.function(model.update, jit_compile=jit_compile)
    losses = []
    for _ in range(2):
        update(*views)
        losses.append(float(model.loss_tracker.result()))
        model.loss_tracker.reset_state()
    return model, np.array(losses)


@pytest.fixture(scope="module")
def views(digits):
    model = build_contrastive_model(PretrainConfig(), (32, 32, 3), seed=3, method=SSL_METHODS["simclr"])
    return model.views(tf.constant(digits[:32]))


@pytest.mark.parametrize("method", list(SSL_METHODS))
def test_mixed_precision_steps_follow_the_float32_steps_and_leave_the_global_policy(
        method, views):
    """bfloat16 compute, float32 weights: the first two losses within 3 % (or 0.005, the
    losses being cosines that can sit near 0) of float32's; bfloat16 keeps 8 bits of
    mantissa. The second loss also checks the update."""
    import keras

    _, want = _two_step_losses(PretrainConfig(), method, views)
    model, got = _two_step_losses(PretrainConfig(precision="mixed_bfloat16"), method, views)
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=5e-3)
    assert model.encoder.compute_dtype == "bfloat16" and model.encoder.dtype == "float32"
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.parametrize("method", ["simclr", "simsiam"])
def test_xla_compiled_steps_follow_the_default_steps(method, views):
    """XLA reorders float32 sums: the losses of two steps agree to 1e-4 (relative)."""
    _, want = _two_step_losses(PretrainConfig(), method, views)
    _, got = _two_step_losses(PretrainConfig(), method, views, jit_compile=True)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert not np.array_equal(got[0], got[1])  # the first step did change the weights
