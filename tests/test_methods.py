"""One home for what a method is: ``cpcfl_tf/methods/federated.py``."""
import ast
import dataclasses

import numpy as np
import pytest

from helpers import ROOT

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.errors import UserError
from cpcfl_tf.clustered.restarts import should_restart
from cpcfl_tf.methods.federated import ASSIGNMENTS, METHODS, START_LABELS, get_method, run_label
from cpcfl_tf.plan.resolve import resolve


def federated(method: str, pretraining: str, **fields):
    """The quick preset's federated section for ``method`` as it runs (15 clients, 3 groups)."""
    return plan(method, pretraining, **fields).federated


def plan(method: str, pretraining: str, **fields):
    """The quick preset's plan for ``method`` (15 clients, 3 groups)."""
    return resolve(get_preset("quick").with_overrides(
        federated={"method": method, "pretraining": pretraining, **fields}))


@pytest.mark.parametrize("method, pretraining, models, tc", [
    ("fedavg", "none", 1, 0),      # FedAvg (None): one random model, no Tc phase
    ("fedavg", "simclr", 1, 10),   # FedAvg (SimCLR): CP-CFL with N = 1
    ("ifca", "none", 3, 0),
    ("ifca", "fedavg", 3, 0),
    ("ifca", "simclr", 3, 0),      # IFCA never has the Tc phase
    ("cp-cfl", "simclr", 3, 10),
    ("cp-cfl", "supervised", 3, 10),
    ("centralized", "simclr", 3, 0),
])
def test_each_method_resolves_to_its_pool_size_and_tc(method, pretraining, models, tc):
    fl = federated(method, pretraining, num_clusters=3, head_rounds=10)
    assert (fl.num_clusters, fl.head_rounds) == (models, tc)


def test_a_start_the_method_cannot_use_is_refused_in_one_line():
    with pytest.raises(UserError, match="cp-cfl cannot start from pre-training 'none'; "
                                        "choose one of .*; for random initialisation use "
                                        "method ifca"):
        federated("cp-cfl", "none")
    with pytest.raises(UserError, match="fedavg cannot start from pre-training 'fedavg'"):
        federated("fedavg", "fedavg")
    with pytest.raises(UserError, match="unknown federated.method 'fedprox'; choose one of "
                                        "fedavg, ifca, cp-cfl, cp-cfl-restart, centralized"):
        federated("fedprox", "none")
    with pytest.raises(UserError, match="unknown federated.method"):
        get_method("fedprox")


def test_the_personalized_methods_options_are_their_papers_and_checked_in_one_line():
    """FedRep's one representation epoch of E, Ditto's lambda = 1, FedAvg+FT's 5
    fine-tuning epochs (docs/choices.md), each refused in one line where it cannot run."""
    assert federated("fedrep", "simclr").options == {"rep_epochs": 1}
    assert federated("ditto", "none").options == {"lambda": 1.0}
    assert federated("fedavg-ft", "simclr").options == {"finetune_epochs": 5}
    assert federated("fedavg-ft", "simclr").head_rounds == 10  # FedAvg's own Tc phase
    assert federated("fedrep", "simclr").head_rounds == 0
    bad = [("fedrep", {"local_epochs": 1}, "fedrep trains the head, then the encoder: "
                                            "federated.local_epochs must be at least 2, got 1"),
           ("fedrep", {"options": {"rep_epochs": 3}}, "fedrep: federated.options rep_epochs "
                                                      "must be a whole number from 1 to 2, "
                                                      "got 3"),
           ("fedrep", {"options": {"rep_epochs": 0.5}}, "rep_epochs must be a whole number"),
           ("fedavg-ft", {"options": {"finetune_epochs": 0}}, "finetune_epochs must be a whole"),
           ("ditto", {"options": {"lambda": -0.1}}, "ditto: federated.options lambda must be "
                                                    ">= 0, got -0.1")]
    for method, fields, message in bad:
        with pytest.raises(UserError, match=message):
            federated(method, "none", **fields)


def test_only_ifca_restarts():
    failed = np.zeros(15, np.int64)  # every client in cluster 0
    for name in ("fedavg", "ifca", "cp-cfl"):
        run = plan(name, "simclr" if name == "cp-cfl" else "none")
        assert should_restart(run, run.federated.restart_round, 0, failed) == (name == "ifca")


def test_a_new_method_is_one_entry(monkeypatch):
    """A method registered in METHODS alone is accepted by the config and followed by the
    algorithm: here IFCA without restarts and with the Tc phase from a pre-trained encoder."""
    entry = dataclasses.replace(METHODS["ifca"], name="ifca-tc", label="IFCA-Tc",
                                restarts=False, head_phase=True)
    monkeypatch.setitem(METHODS, "ifca-tc", entry)
    run = plan("ifca-tc", "simclr", head_rounds=10)
    assert (run.num_models, run.head_rounds) == (3, 10)
    assert not should_restart(run, run.federated.restart_round, 0, np.zeros(15, np.int64))
    assert run_label("ifca-tc", "simclr") == "IFCA-Tc (SimCLR)"


def test_a_new_personalized_method_is_one_entry(monkeypatch):
    """docs/extending.md: a personalized method is one entry of fields. FedRep with two
    representation epochs keeps the head, trains it first and then the encoder twice, and
    sends the encoder only; a Ditto-like entry keeps a whole personal model and sends all."""
    from cpcfl_tf.clustered import algorithm

    entry = dataclasses.replace(METHODS["fedrep"], name="fedrep-2", label="FedRep-2",
                                options={"rep_epochs": 2})
    monkeypatch.setitem(METHODS, "fedrep-2", entry)
    run = plan("fedrep-2", "simclr")
    round_ = algorithm.plan_round(run, 0, 0, 0, 15)
    assert algorithm.epoch_parts(run.federated, round_) == ["head", "encoder", "encoder"]
    assert algorithm.kept_arrays(run, 4, 6) == algorithm.unsent_arrays(run, 4, 6) == (4, 5)
    personal = dataclasses.replace(METHODS["fedavg"], name="mine", label="Mine",
                                   head_phase=False, keeps="model", options={"lambda": 0.5})
    monkeypatch.setitem(METHODS, "mine", personal)
    run = plan("mine", "none")
    assert algorithm.kept_arrays(run, 4, 6) == tuple(range(6))
    assert algorithm.unsent_arrays(run, 4, 6) == ()
    assert run.federated.options == {"lambda": 0.5} and run.method.on_flower  # Context.state


def test_every_start_has_a_label_and_every_method_a_known_start():
    import json

    assert all(set(m.starts) <= set(START_LABELS) for m in METHODS.values())
    assert all(m.assign in ASSIGNMENTS for m in METHODS.values())
    # the Flower loopback offers what its run config accepts
    assert [m for m in METHODS if not METHODS[m].on_flower] == [
        "centralized", "local", "cp-cfl-features"]
    schema = json.loads((ROOT / "docs" / "run-record.schema.json").read_text())
    assert schema["$defs"]["kit_methods"]["enum"] == list(METHODS), \
        "run python tools/update_schema.py"
    assert schema["$defs"]["kit_starts"]["enum"] == list(START_LABELS), \
        "run python tools/update_schema.py"
    assert run_label("ifca", "fedavg") == "IFCA (FedAvg)"


def kit_nodes(skip):
    """Every syntax node of the kit's modules but those ``skip(path)`` names, with where it
    is (``path:line``)."""
    for path in sorted((ROOT / "cpcfl_tf").rglob("*.py")):
        if not skip(path):
            for node in ast.walk(ast.parse(path.read_text())):
                yield f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}", node


def compared(node, subjects: set[str]) -> set | None:
    """The constants a comparison about one of ``subjects`` (a name or an attribute) holds;
    None where ``node`` is no such comparison."""
    if not isinstance(node, ast.Compare):
        return None
    parts = [node.left, *node.comparators]
    if not any(isinstance(p, ast.Attribute) and p.attr in subjects
               or isinstance(p, ast.Name) and p.id in subjects for p in parts):
        return None
    return {p.value for p in parts if isinstance(p, ast.Constant)}


def test_no_module_but_methods_compares_a_method_name():
    """``fl.method == "ifca"`` anywhere else would be a second home for what IFCA is
    (checked against the old code: it found runner.py, algorithm.py and config.py)."""
    names = set(METHODS)
    found = [where for where, node in kit_nodes(lambda path: path.relative_to(ROOT).as_posix() == "cpcfl_tf/methods/federated.py")
             if names & (compared(node, {"method"}) or set())]
    assert not found, found


SUBJECTS = {"assign", "asks", "asked", "rule", "method"}
"""What a comparison with a rule's or a method's name is about."""


def test_no_module_but_the_rules_compares_a_rules_name_or_what_it_asks():
    """``assign == "subspaces"`` or ``asked == "group"`` outside :mod:`cpcfl_tf.methods.rules`
    would be a second home for a rule (checked against the old code: it found
    algorithm.py, simulator.py and both Flower apps)."""
    from cpcfl_tf.methods.rules import RULES

    words = set(RULES) | {r.asks for r in RULES.values() if r.asks} | set(METHODS)
    found = []
    for where, node in kit_nodes(lambda path: path.relative_to(ROOT).as_posix() in (
            "cpcfl_tf/methods/federated.py", "cpcfl_tf/methods/rules.py")):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id == "RULES" and isinstance(node.slice, ast.Constant):
            found.append(where)
        if words & (compared(node, SUBJECTS) or set()):
            found.append(where)
    assert not found, found


START_SUBJECTS = {"pretraining", "start"}
"""What a comparison with a start's name is about."""
START_NAME_SETS = {"FEDERATED_STARTS", "SSL_METHODS", "PRETRAIN_METHODS", "PRETRAINED",
                   "PRETRAININGS", "FEDERATED_PRETRAININGS"}
"""Sets of start names a membership test would compare a start against."""


def test_no_module_but_the_starts_compares_a_starts_name():
    """``pretraining != "none"``, ``start in FEDERATED_STARTS`` or
    ``FEDERATED_STARTS.get(pretraining)`` outside :mod:`cpcfl_tf.methods.starts` would be
    a second home for what a start is (checked against the code before the starts' own
    ``check`` and ``pretraining``, at 3ea45ab: it found 13 places in config.py,
    run_plan.py, record.py, clustered/methods.py and flower/server_app.py)."""
    from cpcfl_tf.methods.starts import START

    names = set(START)
    found = []
    # The starts, and the self-supervised registry that names them, are left out.
    for where, node in kit_nodes(lambda path: path.relative_to(ROOT).as_posix() in (
            "cpcfl_tf/methods/starts.py", "cpcfl_tf/methods/ssl.py")
            or path.parent.name == "pretraining"):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in START_NAME_SETS:
            found.append(where)
        consts = compared(node, START_SUBJECTS)
        if consts is None:
            continue
        member = any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) and any(
            isinstance(p, ast.Name) and p.id in START_NAME_SETS for p in node.comparators)
        if names & consts or member:
            found.append(where)
    assert not found, found


def test_every_start_is_one_object_that_says_what_it_is_and_how_it_is_got():
    from types import SimpleNamespace

    from cpcfl_tf.methods.federated import PRETRAINED
    from cpcfl_tf.methods.ssl import FEDERATED_STARTS, SSL_METHODS
    from cpcfl_tf.methods.starts import START

    assert list(START) == ["none", *SSL_METHODS, "fedavg", "supervised", *FEDERATED_STARTS]
    assert PRETRAINED == (*SSL_METHODS, "supervised", *FEDERATED_STARTS)
    assert [n for n, s in START.items() if not s.shared] == ["none", "fedavg"]
    assert [n for n, s in START.items() if not s.on_flower] == ["fedavg"]

    class Source:
        """Records which piece of work a start asks for."""
        def __init__(self):
            self.asked = []

        def __getattr__(self, name):
            def work(*args):
                self.asked.append((name, *args))
                return SimpleNamespace(encoder=SimpleNamespace(get_weights=lambda: [name]))
            return work

    # Each start asks the one source for the plan's pre-training (the run's plan), the
    # FedAvg encoder for the requested config's FedAvg (None) run.
    run = "the run's plan"  # a start passes it on, never reads it
    for name, asked in (("simclr", ("contrastive", run)), ("supervised", ("supervised", run)),
                        ("fedavg", ("fedavg", run)), ("fed-byol", ("federated", run))):
        source = Source()
        START[name].encoder(source, run)
        assert source.asked == [asked], name
    # A pre-training's state is its folder's finished file: the supervised one's weights.
    for name, finished in (("simclr", "pretrain.json"), ("supervised", "encoder.npz"),
                           ("fed-byol", "pretrain.json")):
        source = Source()
        START[name].status(source, run), START[name].ready(source, run)
        assert source.asked == [("pretraining_status", run, finished),
                                ("pretraining_done", run, finished)], name
    source = Source()
    START["fedavg"].ready(source, run)
    assert source.asked == [("fedavg_ready", run)]
    source = Source()
    assert START["none"].encoder(source, run) is None and source.asked == []
    assert START["none"].ready(source, run) and START["none"].status(source, run) == (
        "random initialisation")


REGISTRY_HOMES = {"methods", "plugins.py"}
"""The package that says what a registry's entries are, and the plugins that add to them
(and ``pretraining/``, the self-supervised methods' package): the only ones that may
compare their names."""


def _registry_values():
    """Every registry's names, and the kit's registries and name sets by their module
    names (what a membership test against a registry would name)."""
    from cpcfl_tf.methods import federated as methods, rules, starts
    from cpcfl_tf.methods import ssl

    names = set(METHODS) | set(rules.RULES) | set(starts.START) | set(ssl.SSL_METHODS) \
        | set(ssl.FEDERATED_STARTS)
    registries = {name for module in (methods, rules, starts, ssl)
                  for name, value in vars(module).items()
                  if name.isupper() and isinstance(value, (dict, tuple, frozenset, set))
                  and value and set(value) <= names}
    return names, registries


def _bound(node: ast.Assign, names: set[str], constants: dict) -> None:
    """Note in ``constants`` a module-level name ``node`` binds to a registry name or a
    tuple of them."""
    try:
        value = ast.literal_eval(node.value)
    except ValueError:
        return
    values = value if isinstance(value, tuple) else (value,)
    if values and all(isinstance(v, str) and v in names for v in values):
        constants.update((t.id, value) for t in node.targets if isinstance(t, ast.Name))


def test_no_module_compares_a_registry_name_through_a_variable_either():
    """``(method, start) == FEDAVG_ENCODER_RUN`` or ``method not in SSL_METHODS`` outside
    the registries is a name test a literal-only check misses (checked against 1baca48:
    it found runner.py's FedAvg encoder test, cli.py's and starting.py's membership
    tests): a run's plan carries the decision (``RunPlan.gives``), a start object says
    what it is (``Start.ssl_method``)."""
    names, registries = _registry_values()
    constants = {}  # module-level names bound to a registry name or a tuple of them
    for path in sorted((ROOT / "cpcfl_tf").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                _bound(node, names, constants)
    from cpcfl_tf.methods.federated import FEDAVG_ENCODER_RUN

    constants["FEDAVG_ENCODER_RUN"] = FEDAVG_ENCODER_RUN  # bound to a field, not a literal

    def ident(part):
        return (part.id if isinstance(part, ast.Name) else
                part.attr if isinstance(part, ast.Attribute) else None)

    found = []
    for where, node in kit_nodes(lambda path: path.name in REGISTRY_HOMES
                                 or path.parent.name in REGISTRY_HOMES | {"pretraining"}):
        if not isinstance(node, ast.Compare):
            continue
        parts = {ident(p) for p in (node.left, *node.comparators)}
        member = any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) and any(
            ident(p) in registries for p in node.comparators)
        if parts & set(constants) or member:
            found.append(f"{where}: {ast.unparse(node)}")
    assert not found, found
    assert {"SSL_METHODS", "PRETRAIN_METHODS", "METHODS", "START"} <= registries
