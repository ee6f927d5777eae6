"""A real Flower federation on loopback (``-k flower``): 1 SuperLink + 3 SuperNodes as
processes serving two runs in turn, N = 2 on smoke data. Skipped when the ``[flower]`` extra is not installed."""
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytestmark = pytest.mark.flower

from cpcfl_tf.flower.loopback import Federation, wait_for_file  # noqa: E402

RUN = {"preset": "smoke", "method": "cp-cfl", "pretraining": "simclr", "num-clusters": 2,
       "num-clients": 3, "head-rounds": 1, "seed": 0}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "flower-cache"
    return dict(os.environ, CPCFL_CACHE=str(cache), TF_CPP_MIN_LOG_LEVEL="3")


@pytest.fixture(scope="module")
def federation(tmp_path_factory, env):
    """One SuperLink and 3 SuperNodes for the module's runs, one after another (as a
    deployed federation serves run after run); the last test kills SuperNode 2."""
    with Federation.start(3, tmp_path_factory.mktemp("federation"), env=env) as fed:
        yield fed
    _stopped(fed)


def _group_alive(pid):
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _stopped(fed):
    for proc in [fed.superlink, *fed.supernodes]:
        assert proc.poll() is not None
        deadline = time.monotonic() + 20  # killed children are reaped by init
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(proc.pid), f"processes of group {proc.pid} outlived the test"


def _simulator(rounds, env):
    """The run's config, the simulator's runner, and the server's (cached) encoder."""
    from cpcfl_tf.flower.common import run_config
    from cpcfl_tf.runner import Runner

    os.environ["CPCFL_CACHE"] = env["CPCFL_CACHE"]
    config = run_config({**RUN, "rounds": rounds})
    runner = Runner("flower", config, Path(env["CPCFL_CACHE"]) / "sim", verbose=0)
    return config, runner, runner.encoders(config)


def _simulated_cluster_ids(rounds, env):
    from cpcfl_tf.federated.simulator import run_federated

    config, runner, encoder = _simulator(rounds, env)
    record, _ = run_federated(config, runner.clients(config), encoder_weights=encoder,
                              verbose=0)
    return [r.cluster_ids for r in record.rounds], record.final.accuracy


def test_flower_federation_assigns_the_simulators_clusters(tmp_path, env, federation):
    # Round 1 picks at random with the encoder frozen (t < Tc), round 2 selects by loss.
    expected, accuracy = _simulated_cluster_ids(2, env)  # also fills the encoder cache
    federation.run({**RUN, "rounds": 2, "out": str(tmp_path / "result.json")})
    record = wait_for_file(tmp_path / "result.json", federation, timeout=540)
    assert sorted(record["nodes"].values()) == [0, 1, 2]
    assert [r["cluster_ids"] for r in record["rounds"]] == expected
    assert all(r["replies"] == 3 and r["failed_partitions"] == [] for r in record["rounds"])
    assert record["final"]["accuracy"] == pytest.approx(accuracy, abs=1e-6)


def test_flower_run_survives_a_supernode_killed_in_a_round(tmp_path, env, federation):
    _simulator(2, env)  # the server's encoder, cached before the clock starts
    log = federation.workdir / "supernode-2.log"
    seen = log.read_text().count("train message")  # earlier runs' messages
    federation.run({**RUN, "rounds": 2, "round-timeout": 60.0,
                    "out": str(tmp_path / "result.json")})
    deadline = time.monotonic() + 300
    while log.read_text().count("train message") == seen:
        assert time.monotonic() < deadline, "SuperNode 2 never got a train message"
        time.sleep(0.5)
    federation.kill_supernode(2)  # in the middle of round 1
    record = wait_for_file(tmp_path / "result.json", federation, timeout=540)
    first, second = record["rounds"]
    assert first["replies"] == 2 and first["failed_partitions"] == [2]
    assert second["replies"] == 2 and 2 in second["failed_partitions"]
    assert set(record["final"]["client_accuracy"]) == {"0", "1"}


def test_flower_loopback_rejects_bad_input_before_starting_anything(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "cpcfl_tf.flower.loopback", "--preset", "huge",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=120)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "unknown preset 'huge'" in lines[0]
    assert not (tmp_path / "out").exists()
