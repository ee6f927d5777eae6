"""The kit's shape, as a new maintainer meets it: the top-level listing of ``cpcfl_tf/``,
the largest modules and classes, and those over the sizes a reader holds at once.

Prints markdown. The sizes are physical lines (docstrings and comments included), the
way a reader scrolls them.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Sequence

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
                classes[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    return modules, classes


def listing(root: Path = PACKAGE) -> list[str]:
    """The top level of the package: its packages (with a slash), then its modules."""
    packages = sorted(p.name + "/" for p in root.iterdir()
                      if p.is_dir() and (p / "__init__.py").exists())
    modules = sorted(p.name for p in root.glob("*.py") if p.name != "__init__.py")
    return packages + modules


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
