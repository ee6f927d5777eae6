"""The run plan (cpcfl_tf/plan/resolve.py): a config resolved once into what runs, checked
against its data before anything is written."""
import pytest

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.errors import UserError
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.running.runner import Runner, RunSpec
from cpcfl_tf.plan.context import RunContext


def test_the_plan_holds_what_the_method_runs():
    """The paper's rows, resolved (Sec. "Experimental settings"; Algorithm "CP-CFL"):
    CP-CFL keeps N = 3 and Tc = 10; FedAvg runs one model and no Tc phase from random
    weights; IFCA has no Tc phase; CFL's options get their defaults."""
    paper = get_preset("paper")
    cp = resolve(paper)
    assert (cp.num_models, cp.head_rounds, cp.method.name, cp.start.name) == (
        3, 10, "cp-cfl", "simclr")
    assert cp.requested == paper and cp.config.federated is cp.federated
    assert cp.rule is cp.method.rule and cp.start.pretrained
    fedavg = resolve(paper.with_overrides(federated={"method": "fedavg",
                                                     "pretraining": "none"}))
    assert (fedavg.num_models, fedavg.head_rounds, fedavg.pretraining) == (1, 0, None)
    ifca = resolve(paper.with_overrides(federated={"method": "ifca", "pretraining": "byol"}))
    assert (ifca.num_models, ifca.head_rounds) == (3, 0)
    cfl = resolve(paper.with_overrides(federated={"method": "cfl", "pretraining": "none",
                                                  "options": {"eps1": 0.3}}))
    assert cfl.options["eps1"] == 0.3 and set(cfl.options) == set(cfl.method.options)


def test_the_plan_names_the_pretraining_its_start_needs():
    """SimCLR's temperature 0.1 and BYOL's target rate 0.9 are the paper's ("Experimental
    settings"); the seed is the run's unless pretrain.seed says another; a federated
    start names its algorithm and its settings; random weights need none."""
    quick = get_preset("quick").with_overrides(seed=4)
    simclr = resolve(quick).pretraining
    assert (simclr.method, simclr.settings["temperature"], simclr.seed, simclr.federated) == (
        "simclr", 0.1, 4, None)
    byol = resolve(quick.with_overrides(federated={"pretraining": "byol"},
                                        pretrain={"seed": 7})).pretraining
    assert (byol.method, byol.settings["target_decay"], byol.seed) == ("byol", 0.9, 7)
    fed = resolve(quick.with_overrides(federated={"pretraining": "fed-simclr"},
                                       partition={"unlabeled": "iid"})).pretraining
    assert (fed.method, fed.federated.method.name) == ("simclr", "fed")
    assert fed.federated.settings["batch_size"] == \
        fed.federated.method.settings["batch_size"].default
    assert resolve(quick.with_overrides(federated={"pretraining": "supervised"})
                   ).pretraining.settings == {}
    assert resolve(quick.with_overrides(federated={"method": "ifca", "pretraining": "none"})
                   ).pretraining is None


def test_a_script_resolves_each_run_once_and_refuses_bad_data_before_any_run(
        tmp_path, monkeypatch):
    """Every run is resolved once however often the runner asks about it, and a run its
    data cannot hold stops the script before the first run is made."""
    import cpcfl_tf.running.runner as runner_module

    calls = []

    def counted(config, **options):
        calls.append(config.federated.method)
        return resolve(config, **options)

    monkeypatch.setattr(runner_module, "resolve", counted)
    runner = Runner("t", get_preset("smoke"), tmp_path / "out", context=RunContext(verbose=0, dry_run=True))
    spec = RunSpec("ifca-none", "ifca", "none")
    for _ in range(3):
        runner.plan_of(spec), runner.decide(spec), runner.planned(spec)
    assert calls == ["ifca"]
    # 60 clients of 8 + 8 + 2 + 2 images need 1,200 of the 600 training images the smoke
    # preset's clients share (digits train[697:]): refused in one line, by arithmetic.
    big = RunSpec("many", "ifca", "none", partition={"num_clients": 60})
    with pytest.raises(UserError, match=r"need 1,200 but digits:train\[697:\] holds 600") as err:
        runner.plan_of(big)
    assert "\n" not in str(err.value)
