"""Seeded builds that other threads cannot disturb.

``keras.utils.set_random_seed(seed)`` seeds Python's global ``random`` among others, and
every Keras initializer or ``SeedGenerator`` built without a seed takes its seed from
that stream (``keras.src.random.seed_generator.make_default_seed``). A thread of the same
process that draws from Python's global ``random`` meanwhile shifts the stream, and the
build gets other weights. Flower's heartbeat thread does (``random.uniform``, every few
seconds, in the ServerApp and ClientApp processes), so a server that pre-trained or drew
its pool while it beat started from other weights than the simulator: seen as a rare
mismatch of the Simulation Engine's encoder under load.

:func:`seeded` seeds as ``set_random_seed`` does and, for the block, gives Keras's seed
draws a private ``random.Random(seed)``: the same numbers a quiet process draws from the
global stream after ``random.seed(seed)``, so every build, and every result made before
this module existed, keeps its bits.
"""

from __future__ import annotations

import contextlib
import random
import threading

_LOCK = threading.RLock()
"""One seeded build at a time: the private stream is the module's while the block runs."""


@contextlib.contextmanager
def seeded(seed: int):
    """``keras.utils.set_random_seed(seed)``, then build in the block: Keras's default
    seeds come from a stream of this block's own (where Keras keeps its seed draw where
    this version does; elsewhere from the global stream, as ``set_random_seed`` alone)."""
    import keras
    from keras.src.random import seed_generator

    with _LOCK:
        keras.utils.set_random_seed(seed)
        shared = getattr(seed_generator, "python_random", None)
        if shared is not None:
            seed_generator.python_random = random.Random(seed)
        try:
            yield
        finally:
            if shared is not None:
                seed_generator.python_random = shared
