"""Seeded builds are the same while another thread of the process draws from Python's
global ``random``, as Flower's heartbeat thread does in the ServerApp and ClientApp
processes (``cpcfl_tf.models.seeding``)."""
import contextlib
import random
import threading

import keras
import numpy as np

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.methods.ssl import SSL_METHODS


@contextlib.contextmanager
def beating():
    """A thread drawing from Python's global ``random`` without pause (a heartbeat's
    jitter, many times over)."""
    stop = threading.Event()

    def beat():
        while not stop.is_set():
            random.uniform(0.7, 0.9)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_the_pool_and_the_pretraining_model_are_the_quiet_builds_while_a_thread_draws():
    from cpcfl_tf.clustered import pool
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model

    config = get_preset("smoke")
    run = resolve(config)
    # Plain Keras in a quiet process: seed, then build.
    keras.utils.set_random_seed(11)
    quiet_pool = pool.build_template(run, (32, 32, 3), 10).get_weights()
    quiet_model = build_contrastive_model(config.pretrain, (32, 32, 3), method=SSL_METHODS["byol"],
                                          seed=12).get_weights()
    # The same plain build while the thread draws gets other weights (what the kit did
    # before, and why the Simulation Engine's server once started from another encoder).
    with beating():
        for _ in range(5):
            keras.utils.set_random_seed(11)
            if not _same(pool.build_template(run, (32, 32, 3), 10).get_weights(), quiet_pool):
                break
        else:
            raise AssertionError("the drawing thread never moved a plain seeded build")
        pool._DRAWN.clear()  # built now, not taken from an earlier test's draw
        drawn = pool.drawn_classifier(run, (32, 32, 3), 10, 11)
        model = build_contrastive_model(config.pretrain, (32, 32, 3), method=SSL_METHODS["byol"],
                                        seed=12).get_weights()
    assert _same(drawn, quiet_pool)
    assert _same(model, quiet_model)
