"""Pre-training under tf.distribute.MirroredStrategy (``--distribute mirrored``), on two
logical CPU devices: one step equals the single-device step on the same batch."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.ssl import SSL_METHODS

CHILD = textwrap.dedent("""
    import json, sys
    import keras
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    from cpcfl_tf.plan.sections import PretrainConfig
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model, make_strategy, pretrain

    images = tf.constant(np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3), np.uint8))
    strategy = make_strategy("mirrored")
    out = {"replicas": strategy.num_replicas_in_sync}
    from cpcfl_tf.methods.ssl import SSL_METHODS

    for method in SSL_METHODS:  # every registered method, one added later too
        config = PretrainConfig(epochs=1, batch_size=8)
        # Plain SGD: Adam's first step is blind to the gradient's scale, SGD shows it.
        single = build_contrastive_model(config, (32, 32, 3), method=SSL_METHODS[method], seed=0)
        single.compile(optimizer=keras.optimizers.SGD(1.0))
        single.optimizer.build(single.online_variables)
        with strategy.scope():
            mirrored = build_contrastive_model(config, (32, 32, 3), method=SSL_METHODS[method], seed=0)
            mirrored.compile(optimizer=keras.optimizers.SGD(1.0))
            mirrored.optimizer.build(mirrored.online_variables)
        before = max(float(np.abs(a - b).max()) for a, b in
                     zip(single.encoder.get_weights(), mirrored.encoder.get_weights()))
        losses = [float(single.make_step(False)(images)["loss"]),
                  float(mirrored.make_mirrored_step(strategy)(images)["loss"])]
        after = max(float(np.abs(a - b).max()) for a, b in
                    zip(single.encoder.get_weights(), mirrored.encoder.get_weights()))
        moved = max(float(np.abs(a - b).max()) for a, b in zip(
            single.encoder.get_weights(),
            build_contrastive_model(config, (32, 32, 3), method=SSL_METHODS[method], seed=0).encoder.get_weights()))
        out[method] = {"before": before, "losses": losses, "after": after, "moved": moved}
    result = pretrain(PretrainConfig(epochs=1, batch_size=8), images.numpy(), sys.argv[1],
                      seed=0, verbose=0, distribute="mirrored", method=SSL_METHODS["simclr"])
    out["history"] = result.history
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path_factory.mktemp("pre"))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_the_strategy_has_two_replicas(mirrored):
    assert mirrored["replicas"] == 2


@pytest.mark.parametrize("method", list(SSL_METHODS))
def test_a_mirrored_step_equals_the_single_device_step(mirrored, method):
    row = mirrored[method]
    assert row["before"] == 0.0  # same initial weights
    single, split = row["losses"]
    assert split == pytest.approx(single, rel=1e-5, abs=1e-6)  # SimCLR: gathered negatives
    # The step moved the encoder, and by the same amount: a missing 1/R loss scale
    # would move it twice as far, per-replica statistics elsewhere.
    assert row["moved"] > 1e-3
    assert row["after"] < 1e-5 * row["moved"]


def test_pretraining_runs_end_to_end_mirrored(mirrored):
    assert len(mirrored["history"]) == 1 and mirrored["history"][0]["loss"] > 0


def test_unknown_strategy_is_a_user_error():
    from cpcfl_tf.pretraining.pretrain import make_strategy

    with pytest.raises(UserError, match="unknown --distribute 'tpu'"):
        make_strategy("tpu")
