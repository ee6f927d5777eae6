"""Shared fixtures. The Fashion-MNIST tests read the real Debian files on purpose:
CI installs them (.ci/run), and a missing file must fail loudly, not skip."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# numpy's OpenBLAS single-threaded, in this process and every one the suite starts (the
# test workers, scripts, a federation's processes): the kit's BLAS calls are small, and
# an OpenBLAS thread spins after each one, taking a core the other workers' TensorFlow
# needs when three workers share two cores (docs/performance.md has the measurement).
# The server's weighted average is the same bits with one thread or two; other products
# (the clustering families' similarities and SVDs) may differ in their last bits, as
# they do between machines with other numbers of cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# The kit asks TensorFlow for its oneDNN kernels when it is imported (cpcfl_tf/__init__.py),
# which TensorFlow reads once, at its own import: a test module that imports tensorflow or
# keras before cpcfl_tf would otherwise run without them on a CPU where TensorFlow leaves
# them off (the AVX2 EPYC), while the processes it starts have them, and their bits differ.
import cpcfl_tf  # noqa: E402,F401

import pytest  # noqa: E402


SLOW_FILES = ("test_flower.py", "test_scripts.py", "test_table2.py", "test_studies.py",
              "test_simulator.py",
              "test_flower_nodes.py", "test_experiments.py", "test_reliability.py",
              "test_linear_eval.py", "test_contrastive.py", "test_ssl_methods.py",
              "test_encoder_selection.py", "test_federated_pretraining.py")
"""The files whose tests take longest in all (measured with ``--durations=0``), longest
first: under ``--dist loadfile`` they start first and the short files fill the gaps at
the end, instead of xdist's default order (files with the most tests first), which
queued the Flower files late."""


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores this process may use. Some tests wait
    with their core idle (the Flower federations' processes starting, a killed
    SuperNode's missed heartbeats), and a third worker on 2 cores fills those waits:
    docs/performance.md has the timings."""
    return len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1) + 1


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep our file order
        config.option.loadscopereorder = False


SLOW_TOO = ("test_families.py", "test_mirrored.py", "test_shipped_encoders.py",
            "test_claims.py", "test_centralized.py", "test_diagnostics.py")
"""Files outside :data:`SLOW_FILES` whose tests run federations or pre-trainings too."""
SLOW_TESTS = ("test_a_plugins_ssl_method_and_rule_run_as_the_kits_own",
              "test_one_bad_value_in_any_field_leaves_out_that_reply_and_nothing_else",
              "test_resnets_match_the_papers_flops",
              "test_tensorboard_gets_every_round_and_every_pretraining_epoch",
              "test_max_clients_per_step_reaches_the_runs_and_changes_nothing")
"""The longest tests of the other files (over 10 s each, measured with ``--durations``)."""


def pytest_collection_modifyitems(config, items):
    """Order the files (:data:`SLOW_FILES` first) and mark the ``slow`` tier: every test
    of :data:`SLOW_FILES` and :data:`SLOW_TOO` and each of :data:`SLOW_TESTS`, so that
    ``pytest -m "not slow"`` is the fast tier of the edit-test loop (README, "Tests")."""
    rank = {name: k for k, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES)))  # stable
    slow = pytest.mark.slow
    for item in items:
        if (item.path.name in SLOW_FILES or item.path.name in SLOW_TOO
                or item.name.split("[")[0] in SLOW_TESTS):
            item.add_marker(slow)


SUITE_CPU = os.environ.get("CPCFL_SUITE_CPU")
"""A file to which each test appends its CPU seconds (``tools/suite_times.py --cpu``)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``$CPCFL_SUITE_CPU``: the CPU seconds (user + system) of each test's setup,
    call and teardown, in its worker and in the processes the worker waited for (the
    scripts it ran, a federation's processes), one JSON line per test, with its worker's
    process id and when it ended (each worker's timeline: ``tools/suite_times.py
    --workers``)."""
    if not SUITE_CPU:
        yield
        return
    import json
    import resource
    import time

    def cpu(who):
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    before = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    yield
    line = json.dumps({"test": item.nodeid,
                       "worker": round(cpu(resource.RUSAGE_SELF) - before[0], 3),
                       "processes": round(cpu(resource.RUSAGE_CHILDREN) - before[1], 3),
                       "pid": os.getpid(), "end": round(time.time(), 1)})
    with open(SUITE_CPU, "a") as log:  # one short line per write: workers do not interleave
        log.write(line + "\n")


@pytest.fixture(scope="session", autouse=True)
def encoder_cache(tmp_path_factory):
    """One encoder cache for the whole suite, so the smoke SimCLR encoder and FedAvg
    encoders are built once (never ./cache): under pytest-xdist one for all its workers
    (beside their own temporary folders), as several processes of a study share one
    cache, each entry written atomically. Tests about building or damaging cache entries
    point CPCFL_CACHE at a folder of their own."""
    with pytest.MonkeyPatch.context() as patch:
        base = tmp_path_factory.getbasetemp()
        folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "encoder-cache"
        patch.setenv("CPCFL_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="session")
def fmnist_clients():
    """The quick preset's client splits: Fashion-MNIST train[50000:] and test."""
    # Imported here, not at the top: a pytest run with this file and tests that need no
    # TensorFlow (tests/test_experiments.py starts one) does not import it (about 7 CPU-s).
    from cpcfl_tf.data.sources import load_labeled

    return (load_labeled("fashion_mnist_idx", "train[50000:]"),
            load_labeled("fashion_mnist_idx", "test"))
