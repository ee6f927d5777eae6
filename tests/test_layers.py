"""The kit's modules import one way: data -> config -> models -> contrastive -> federated
-> the command-line edge (cli, Flower, plots, report; the runner; the script
scaffold). Checked on every import
statement, module level or inside a function."""
import ast

from helpers import ROOT

LAYERS = {
    "errors": 0, "results": 0, "scalars": 0, "environment": 0, "compat": 0,
    "data": 1, "methods": 1,
    "config": 2, "dataset_pairs": 2,
    "models": 3, "flops": 3,
    "contrastive": 4,
    "federated": 5,
    "record": 3,
    "plots": 6, "cli": 6, "flower": 6, "report": 6, "judge": 6,
    "runner": 7,
    "script": 8,
}
"""Layer of each top-level part of ``cpcfl_tf``; a module may import its own layer or lower."""


def layer(module: str) -> int:
    return LAYERS[module.split(".")[1]]


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
        assert "cpcfl_tf.config" not in path.read_text(), path.name
