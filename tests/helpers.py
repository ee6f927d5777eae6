"""What several test modules share (pytest puts this folder on sys.path)."""
from pathlib import Path

import numpy as np

from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.plan.context import RunContext


def __getattr__(name):
    """``InProcessGrid`` and ``run_in_process``: the federation in one process
    (:mod:`cpcfl_tf.flower.in_process`), imported when a test asks (they need flwr)."""
    if name in ("InProcessGrid", "run_in_process"):
        from cpcfl_tf.flower import in_process

        return getattr(in_process, name)
    raise AttributeError(name)

ROOT = Path(__file__).resolve().parents[1]


SCRIPT_FOLDERS = ("experiments", "benchmarks", "tools")
"""Where the scripts live: the paper's tables and the report, speed measurements,
maintenance tools."""


def plan_of(preset: str = "smoke", **federated):
    """The plan of ``preset`` with ``federated`` settings (the method's resolved N, Tc and
    options: what the algorithm takes)."""
    from cpcfl_tf.plan.presets import get_preset

    return resolve(get_preset(preset).with_overrides(federated=federated))


def script_path(name):
    """The file of script ``name``, in whichever of :data:`SCRIPT_FOLDERS` holds it."""
    (path,) = [p for folder in SCRIPT_FOLDERS if (p := ROOT / folder / f"{name}.py").exists()]
    return path


def script(name):
    """Script ``name`` imported as a module (its ``main(argv)`` runs in-process)."""
    from cpcfl_tf.running.script import load_script

    return load_script(script_path(name))


RECORD_SCHEMA = ROOT / "docs" / "run-record.schema.json"
def schema_errors(value, schema=None) -> list[str]:
    """Where ``value`` breaks ``schema`` (default: the run record's), as ``jsonschema``'s
    Draft 2020-12 validator finds it: one line per error, its JSON path and message. An
    integer is a JSON integer, as Python's json writes it (not 1.0, not true)."""
    import json

    import jsonschema

    if schema is None:
        schema = json.loads(RECORD_SCHEMA.read_text())
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool))
    validator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                             type_checker=checker)(schema)
    return [f"{error.json_path}: {error.message}"
            for error in sorted(validator.iter_errors(value), key=lambda e: e.json_path)]


def run_record_errors(record: dict) -> list[str]:
    """Schema errors, and what the schema cannot say: rounds count 1..T, and every round
    has one cluster id per client."""
    errors = schema_errors(record)
    if not errors:
        rounds = [r["round"] for r in record["rounds"]]
        if rounds != list(range(1, len(rounds) + 1)):
            errors.append(f"$.rounds: rounds are {rounds[:3]}..., not 1..T")
        if any(len(r["cluster_ids"]) != len(record["clients"]) for r in record["rounds"]):
            errors.append("$.rounds: cluster_ids do not have one id per client")
    return errors


def _simulator(rounds, out, run):
    """The run's config, the simulator's runner, and the server's (cached) encoder."""
    from cpcfl_tf.flower.common import run_config
    from cpcfl_tf.running.runner import Runner

    config = run_config({**run, "rounds": rounds})
    runner = Runner("flower", config, out, context=RunContext(verbose=0))
    return config, runner, runner.encoders(resolve(config))


def simulated(run, rounds, out, dropped=None):
    """The simulator's run of a Flower run config ``run``: cluster ids per round, each
    client's test accuracy in every scored round (the last is the final's), the server's
    encoder and the record's final. ``dropped={round: clients}`` drops those clients'
    training replies from that round, as a killed SuperNode's or a reply the server
    left out."""
    import cpcfl_tf.clustered.simulator as simulator
    from cpcfl_tf.clustered import algorithm

    config, runner, encoder = _simulator(rounds, out, run)
    train, score, scores = simulator._Simulation.train, simulator.client_accuracy, []

    def failing(self, models, plan):
        replies = train(self, models, plan)
        gone = sorted((dropped or {}).get(plan.round + 1, []))
        if not gone:
            return replies
        keep = ~np.isin(replies.clients, gone)
        return algorithm.Replies(replies.clients[keep], replies.cluster_ids[keep],
                                 replies.sizes[keep], [w[keep] for w in replies.weights],
                                 gone)

    def scored(labels, probs):
        scores.append(score(labels, probs))
        return scores[-1]

    import pytest

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(simulator._Simulation, "train", failing)
        patch.setattr(simulator, "client_accuracy", scored)
        record, _ = simulator.run_federated(resolve(config), runner.data.clients(config),
                                            encoder_weights=encoder, context=RunContext(verbose=0))
    return [r.cluster_ids for r in record.rounds], scores, encoder, record.final


class Killed(Exception):
    """Raised by :func:`kill_after`: a run stopped between rounds, its checkpoint written."""


def kill_after(rounds):
    """An ``on_round`` that stops a run after round ``rounds`` (its checkpoint is saved
    before ``on_round`` is called), as a kill between rounds would."""
    def on_round(record, state):
        if record["round"] == rounds:
            raise Killed
    return on_round
