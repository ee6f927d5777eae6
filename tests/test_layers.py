"""The kit's modules import one way, package by package: the foundations (errors, stored
layouts, how a federation combines weights, data, plugins) -> what each method is (``methods/``, the registries every config
checks) -> the run asked for and its plan (``plan/``) -> records and models ->
pretraining -> clustered -> Flower -> running (reports, the runner, then the command line
and the script scaffold) -> the paper's evidence, and inside each package in the order
below. Checked on every import statement, module level or inside a function (an import
inside a function keeps TensorFlow out of a process that does not need it; it never
dodges a circle)."""
import ast

from helpers import ROOT

LAYERS = {
    "errors": 0, "compat": 0, "flops": 0, "aggregation": 0,
    "data": 1, "plugins": 1,
    "methods": 2,
    "plan": 3,
    "records": 4, "models": 4,
    "pretraining": 5,
    "clustered": 6,
    "flower": 7,
    "running": 8,
    "evidence": 9,
}
"""Layer of each part of ``cpcfl_tf`` (a top-level module or package, never a module of
one: the top level is the layers); a module may import its own layer or lower."""


def _method_modules(entries) -> tuple[str, ...]:
    """The modules under ``pretraining/`` that registry ``entries`` name, in its order."""
    prefix = "cpcfl_tf.pretraining."
    return tuple(e.module[len(prefix):] for e in entries if e.module.startswith(prefix))


def _inside():
    from cpcfl_tf.methods.ssl import FEDERATED_SSL, SSL_METHODS

    ssl = _method_modules(SSL_METHODS.values())
    federated = tuple(m for m in _method_modules(FEDERATED_SSL.values()) if m != "fedavg_ssl")
    return {
        "methods": ("ssl", "starts", "clustering", "rules", "federated"),
        "plan": ("context", "choices", "sections", "config", "identity", "presets", "overrides",
                 "resolve"),
        "records": ("files", "environment", "scalars", "record", "store"),
        "clustered": ("restarts", "diagnostics", "clients", "metrics", "local", "stacked",
                      "backends", "algorithm", "pool", "centralized", "simulator",
                      "starting"),
        # Each self-supervised method's file (its registry entry names it) sits on the
        # model and the losses; each federated pre-training's on fedavg_ssl: a new one
        # takes its place here without an edit.
        "pretraining": ("losses", "model", *ssl, "pretrain", "fedavg_ssl",
                        *federated, "federated_pretrain", "linear_eval", "knn", "timing"),
        "running": ("report", "compare", "run_data", "taking", "runner", "cli", "script"),
        "evidence": ("dataset_pairs", "judge", "plots", "reliability", "reliability_report",
                     "selection", "federated_pretraining", "catalogue", "claims", "tree", "judging",
                     "claims_report", "provenance", "readme_table"),
    }


INSIDE = _inside()
"""The order of the modules inside a package: a module imports only those before it."""


def layer(module: str) -> int:
    """The layer of the longest part of ``module``'s name that :data:`LAYERS` lists."""
    parts = module.split(".")[1:]
    return next(LAYERS[".".join(parts[:k])] for k in range(len(parts), 0, -1)
                if ".".join(parts[:k]) in LAYERS)


def modules():
    """Every module of the kit by dotted name, with its file."""
    found = {}
    for path in sorted((ROOT / "cpcfl_tf").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path, known):
    """The kit's modules ``path`` imports (``from package import module`` names the
    module; importing a package is importing its ``__init__``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module in known:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(known)
            out |= subs or {node.module}
            if len(subs) < len(node.names):
                out.add(node.module)
    return out


def test_the_import_graph_has_no_circle():
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    state, circles = {}, []

    def visit(name, stack):
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                circles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, circles


def test_inside_a_package_modules_import_in_order():
    known = modules()
    wrong = []
    for package, order in INSIDE.items():
        listed = {f"cpcfl_tf.{package}.{m}" for m in order}
        present = {n for n in known if n.startswith(f"cpcfl_tf.{package}.")}
        assert present == listed, f"{package}: place {sorted(present ^ listed)} in INSIDE"
        rank = {f"cpcfl_tf.{package}.{m}": k for k, m in enumerate(order)}
        for name in listed:
            for target in imports(known[name], known):
                if target in rank and rank[target] >= rank[name] and target != name:
                    wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def test_every_import_points_down_or_sideways():
    wrong = []
    for path in sorted((ROOT / "cpcfl_tf").rglob("*.py")):
        name = "cpcfl_tf." + ".".join(path.relative_to(ROOT / "cpcfl_tf").with_suffix("").parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        if name == "cpcfl_tf":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                       else [])
            for target in targets:
                if target.startswith("cpcfl_tf.") and layer(target) > layer(name):
                    wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def test_the_data_layer_knows_nothing_of_configs():
    for path in (ROOT / "cpcfl_tf" / "data").glob("*.py"):
        assert "cpcfl_tf.plan.config" not in path.read_text(), path.name


def test_the_top_level_is_the_layers():
    # Every top-level module or package has its layer, and no module of a package has
    # one of its own: a package is one layer (the picture of the top level has no arrow
    # running back up).
    root = ROOT / "cpcfl_tf"
    top = {p.stem for p in root.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    assert top == set(LAYERS)
    assert not [key for key in LAYERS if "." in key]


def test_the_shape_tool_counts_resolutions_builds_and_lookups_below_the_runner(tmp_path):
    # tools/shape.py's flow figures on a hand-made package: one plan resolved (a
    # Path.resolve() is no plan), two configs built, and of the registry lookups only
    # the one below the runner counts (running/ is the runner's own layer).
    from helpers import script

    package = tmp_path / "cpcfl_tf"
    (package / "clustered").mkdir(parents=True)
    (package / "running").mkdir()
    (package / "__init__.py").write_text("")
    (package / "clustered" / "a.py").write_text(
        "from pathlib import Path\n"
        "def f(config, fl):\n"
        "    Path('x').resolve()\n"
        "    rule = METHODS[fl.method].rule\n"
        "    start = START.get(fl.pretraining)\n"
        "    return config.with_overrides(seed=1)\n")
    (package / "running" / "b.py").write_text(
        "def g(config):\n"
        "    plan = resolve(config)\n"
        "    return METHODS[plan.method], Config()\n")
    places = script("shape").flow(package)
    assert places["resolve"] == ["cpcfl_tf/running/b.py:2"]
    assert sorted(places["builds"]) == ["cpcfl_tf/clustered/a.py:6", "cpcfl_tf/running/b.py:3"]
    assert sorted(places["lookups"]) == ["cpcfl_tf/clustered/a.py:4", "cpcfl_tf/clustered/a.py:5"]


def test_the_code_metrics_count_what_a_hand_count_gives():
    """tools/code_metrics.py, the closing note's figures, on a module counted by hand: four
    functions, one fully annotated (``self`` needs none; ``**kw`` does), three
    annotations naming Any (one in a string), Runner's three parameters besides self."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("code_metrics", ROOT / "tools" / "code_metrics.py")
    metrics = importlib.util.module_from_spec(spec)
    sys.modules["code_metrics"] = metrics  # its dataclass looks its module up
    spec.loader.exec_module(metrics)
    source = '''
from typing import Any
import typing
class Runner:
    def __init__(self, a: int, b, *, c: "Any" = 1) -> None: ...
def typed(x: dict[str, Any]) -> typing.Any: ...
def untyped(x): ...
def star(*args: int, **kw) -> int: ...
'''
    m = metrics.Metrics()
    metrics.add_source(m, "m.py", source)
    assert (m.functions, m.annotated, m.any_in_signatures, m.runner_parameters) == (4, 1, 3, 3)
    assert m.lines == {"m.py": 8}  # the blank first line and seven
