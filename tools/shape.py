"""The kit's shape, as a new maintainer meets it: the top-level listing of ``cpcfl_tf/``,
the largest modules, classes and experiment scripts, those over the sizes a reader holds
at once, and how a run's plan flows down: where runs are resolved, where configs are
built, and the registry names still looked up below the runner.

Prints markdown. The sizes are physical lines (docstrings and comments included), the
way a reader scrolls them. ``--package`` measures another checkout (its ``cpcfl_tf``
folder; its ``experiments`` beside it), e.g. an older commit's worktree.
"""
from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import ArgumentParser, run_cli

PACKAGE = Path(__file__).resolve().parents[1] / "cpcfl_tf"
MODULE_LINES, CLASS_LINES = 400, 200
"""About the most a module and a class should hold (issue 57)."""


def sizes(root: Path = PACKAGE) -> tuple[dict[str, int], dict[str, int]]:
    """Lines per module (by path under the repository) and per class (``path:Class``)."""
    modules, classes = {}, {}
    for path in sorted(root.rglob("*.py")):
        name = str(path.relative_to(root.parent))
        text = path.read_text()
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                classes[f"{name}:{node.name}"] = (node.end_lineno or node.lineno) - node.lineno + 1
    return modules, classes


def listing(root: Path = PACKAGE) -> list[str]:
    """The top level of the package: its packages (with a slash), then its modules."""
    packages = sorted(p.name + "/" for p in root.iterdir()
                      if p.is_dir() and (p / "__init__.py").exists())
    modules = sorted(p.name for p in root.glob("*.py") if p.name != "__init__.py")
    return packages + modules


REGISTRIES = {"METHODS", "START", "RULES", "SSL_METHODS", "FEDERATED_STARTS", "FEDERATED_SSL"}
"""The registries a name is looked up in (:mod:`cpcfl_tf.methods`)."""
LOOKUPS = {"get_method", "get_ssl_method", "federated_start"}
"""The registries' lookup functions."""
BELOW_THE_RUNNER = ("models", "records", "pretraining", "clustered", "flower")
"""The packages below the runner and the scripts, where a run's plan should arrive whole
(their own registries, and the plan that resolves names, are below them)."""
BUILDS = {"with_overrides", "from_dict", "get_preset", "with_encoder", "run_config"}
"""Calls that build or rebuild a ``Config`` (besides ``Config(...)`` itself)."""


def _calls(root: Path):
    """Every call of the package: (path under the repository, line, callee name)."""
    for path in sorted(root.rglob("*.py")):
        name = str(path.relative_to(root.parent))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                callee = f.id if isinstance(f, ast.Name) else f.attr if isinstance(
                    f, ast.Attribute) else None
                yield name, node.lineno, callee, node


def flow(root: Path = PACKAGE) -> dict[str, list[str]]:
    """Where a run is resolved (calls of the function ``resolve``, not of a method of that
    name), where a ``Config`` is built, and the registry lookups by name in the
    packages below the runner (a subscript or ``.get`` of a registry, or a lookup
    function), each as ``path:line``."""
    resolved, built = [], []
    for name, line, callee, node in _calls(root):
        if isinstance(node.func, ast.Name) and callee == "resolve":
            resolved.append(f"{name}:{line}")
        if callee in BUILDS or callee == "Config":
            built.append(f"{name}:{line}")
    lookups = []
    for package in BELOW_THE_RUNNER:
        folder = root / package
        for path in sorted(folder.rglob("*.py")) if folder.is_dir() else []:
            name = str(path.relative_to(root.parent))
            for node in ast.walk(ast.parse(path.read_text())):
                target = (node.value if isinstance(node, ast.Subscript) else
                          node.func.value if isinstance(node, ast.Call) and isinstance(
                              node.func, ast.Attribute) and node.func.attr == "get" else None)
                if isinstance(target, ast.Name) and target.id in REGISTRIES or (
                        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in LOOKUPS):
                    lookups.append(f"{name}:{getattr(node, 'lineno', '?')}")
    return {"resolve": resolved, "builds": built, "lookups": lookups}


def scripts(root: Path = PACKAGE) -> dict[str, int]:
    """Lines per experiment script (``experiments/`` beside the package)."""
    folder = root.parent / "experiments"
    return {p.name: len(p.read_text().splitlines()) for p in sorted(folder.glob("*.py"))}


def report(top: int = 5, root: Path = PACKAGE) -> str:
    modules, classes = sizes(root)
    over_m = {k: v for k, v in modules.items() if v > MODULE_LINES}
    over_c = {k: v for k, v in classes.items() if v > CLASS_LINES}
    lines = [f"Top level of `cpcfl_tf/` ({len(listing(root))} entries): "
             + ", ".join(f"`{e}`" for e in listing(root)), "",
             "| largest modules (lines) | largest classes (lines) |", "|---|---|"]
    big_m = sorted(modules.items(), key=lambda kv: -kv[1])[:top]
    big_c = sorted(classes.items(), key=lambda kv: -kv[1])[:top]
    lines += [f"| `{m}` {n} | `{c}` {k} |" for (m, n), (c, k) in zip(big_m, big_c)]
    lines += ["", f"Modules over {MODULE_LINES} lines: {len(over_m)}; classes over "
                  f"{CLASS_LINES} lines: {len(over_c)}."]
    big_s = sorted(scripts(root).items(), key=lambda kv: -kv[1])[:top]
    lines += ["", "Largest experiment scripts (lines): "
              + ", ".join(f"`{s}` {n}" for s, n in big_s) + "."]
    places = flow(root)
    lines += ["", f"`resolve(...)` call sites: {len(places['resolve'])} "
                  f"({', '.join(places['resolve'])}).",
              f"Places that build or rebuild a `Config` ({', '.join(sorted(BUILDS))}, "
              f"`Config(...)`): {len(places['builds'])}.",
              f"Registry names looked up below the runner ({', '.join(BELOW_THE_RUNNER)}): "
              f"{len(places['lookups'])}"
              + (f" ({', '.join(places['lookups'])})." if places["lookups"] else ".")]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python tools/shape.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=5, help="rows of the largest (default 5)")
    parser.add_argument("--package", type=Path, default=PACKAGE,
                        help="the cpcfl_tf folder to measure, e.g. of another checkout "
                             "(default: this one's)")
    args = parser.parse_args(argv)
    if not (args.package / "__init__.py").is_file():
        parser.error(f"--package {args.package}: no package there; give a checkout's "
                     "cpcfl_tf folder")
    if args.top < 1:
        parser.error(f"--top must be >= 1, got {args.top}")
    print(report(args.top, args.package))


if __name__ == "__main__":
    run_cli(main)
